"""Register: an MLflow model version with its stable tags, metrics, a model card and the package.

The package folder is logged to the release run as `package/` (what `relctl serve` and `rollback`
verify and load), less the weight files the MLflow model holds: one stored copy of them
(release/registry/package_links.py); the MLflow model is logged in the flavour the package's backend names (a
backend with its own MLflow flavour (`Backend.flavour_model`) with a named TensorSpec signature and explicit pip
requirements, so the
version also loads with mlflow.pyfunc; otherwise the runtime files with a `relctl` flavour).

Idempotent against the registry: a version is created with `relctl.release_state=registering` and
becomes `released` once its aliases moved. A re-run after a crash in between finds that version (same
package content, still registering) and finishes it instead of creating a twin. Under the model's
lock, the alias move re-checks that production is still the version the gates compared with. Every state
and alias change goes through release/registry/transitions.py.

Signing is on unless release.yaml says `signing: off` (release/signing/keys.py): the package is signed
here, after every gate before register passed and before it is logged: `relctl-provenance.json` (which
runs, data, weights, code and gates produced it) is written into the folder and the OpenSSF model-signing
signature covers it with every other file (the provenance names the model and this release run, which binds
the signature to the version it creates). What is logged as `package/` is what was signed.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from release import __version__
from release.backends import backend_of
from release.core.errors import RegistryError
from release.core.faults import pause_point
from release.core.hashing import sha256_file
from release.core.package import MANIFEST, PACKAGE_ARTIFACT, PackageManifest
from release.registry import PREVIOUS, PRODUCTION, Registry, package_links, transitions
from release.registry import tags as T
from release.registry.model_page import INTRO as MODEL_INTRO
from release.registry.runs import LoggedModelRef, ReleaseRun
from release.registry.states import REGISTERING, STOPPED
from release.registry.transitions import NOT_CHECKED
from release.signing.keys import SigningKey
from release.signing.package import sign_package
from release.stages.base import Stage, StageInputs, StageResult, location

CONTENT_TAG = T.CONTENT_SHA256


def content_sha256(package: PackageManifest) -> str:
    """Identity of what is served: the sha256 of every file but the manifest (PackageManifest.content_sha256)."""
    return package.content_sha256


def version_tags(package: PackageManifest, lineage: dict[str, Any], extra: dict[str, Any]) -> dict[str, str]:
    """The version's stable tags (release/registry/tags.py): ids, precision, state, integrity anchors."""
    tags: dict[str, Any] = {
        T.TRAINING_RUN: lineage.get("training", {}).get("run_id"),
        T.GIT_COMMIT: lineage.get("training", {}).get("git_commit"),
        T.PRECISION: package.data.get("precision"),
        T.BACKEND: package.backend_id,
        T.SERVING_CONFIG_HASH: package.serving_config_hash,
        T.MANIFEST_SHA256: sha256_file(package.root / MANIFEST),
        T.CONTENT_SHA256: content_sha256(package),
        T.BASE_SHA256: lineage.get("checkpoint", {}).get("base_sha256"),
        T.MERGED_ADAPTER_SHA256: lineage.get("checkpoint", {}).get("merged_adapter_sha256"),
        **extra,
    }
    return _as_tags(tags)


def lineage_tags(lineage: dict[str, Any], package: PackageManifest) -> dict[str, str]:
    """The whole lineage, flat and searchable, for the release run (a version carries only its ids)."""
    training = lineage.get("training", {})
    ckpt = lineage.get("checkpoint", {})
    repo = lineage.get("release_repo", {})
    tags: dict[str, Any] = {
        T.GIT_COMMIT: training.get("git_commit"),
        T.GIT_DIRTY: training.get("git_dirty"),
        T.CONFIG_SHA256: ckpt.get("config_sha256"),
        T.RELEASE_REPO_COMMIT: repo.get("commit"),
        T.RELEASE_REPO_DIRTY: repo.get("dirty"),
        **{f"{T.DATA_PREFIX}{k}{T.SHA256_SUFFIX}": v for k, v in training.get("data_sha256", {}).items()},
        **{f"{T.WEIGHTS_PREFIX}{k}{T.SHA256_SUFFIX}": v for k, v in ckpt.get("weights_sha256", {}).items()},
        **{f"{T.ADAPTER_PREFIX}{k}{T.SHA256_SUFFIX}": v for k, v in ckpt.get("adapter_sha256", {}).items()},
        **_exporter_tags(package.data.get("exporter")),
    }
    return _as_tags(tags)


def _as_tags(tags: dict[str, Any]) -> dict[str, str]:
    # MLflow tags are strings; long values are kept whole in the package manifest instead.
    return {key: (value if isinstance(value, str) else json.dumps(value))[:T.TAG_VALUE_MAX]
            for key, value in tags.items() if value is not None}


def _exporter_tags(exporter: Any) -> dict[str, Any]:
    # promote records {exporter, versions}; a hand-built package may name the exporter as a plain string.
    if isinstance(exporter, dict):
        return {f"{T.EXPORTER_PREFIX}{k}": v for k, v in exporter.items()}
    return {f"{T.EXPORTER_PREFIX}exporter": exporter} if exporter else {}


def provenance(model: str, package: PackageManifest, lineage: dict[str, Any], gate_tags: dict[str, Any],
               release_run: str, builder: str, evidence: dict[str, str] | None = None) -> dict[str, Any]:
    """What the signature vouches for besides the bytes (SLSA-style): which training run, data, weights and
    code made them, which release run and gates passed them (with the sha256 of each gate's evidence file,
    e.g. the eval gate's per-sample results, as logged in the release run), and which relctl built them."""
    training = lineage.get("training", {})
    ckpt = lineage.get("checkpoint", {})
    repo = lineage.get("release_repo", {})
    return {"model": model, "builder": builder, "relctl_version": __version__, "release_run": release_run,
            "training_run": training.get("run_id"), "code_commit": training.get("git_commit"),
            "code_dirty": training.get("git_dirty"), "release_repo_commit": repo.get("commit"),
            "data_sha256": training.get("data_sha256", {}), "weights_sha256": ckpt.get("weights_sha256", {}),
            "adapter_sha256": ckpt.get("adapter_sha256", {}),
            "gates": T.gate_statuses({k: str(v) for k, v in gate_tags.items()}),
            "gate_evidence_sha256": dict(sorted((evidence or {}).items())),
            "manifest_sha256": sha256_file(package.root / MANIFEST), "content_sha256": content_sha256(package)}


def signature_line(signed_by: str) -> str:
    """The card's line on the signature: a reader of the registry UI sees an unsigned version in words."""
    if signed_by == "unsigned":
        return "**Signature**: unsigned (release.yaml says `signing: off`; nothing vouches for these bytes)."
    return (f"**Signature**: signed by release key `{signed_by[:16]}` (OpenSSF model-signing; check it with "
            "`relctl verify`).")


def unfinished_version(registry: Registry, name: str, content: str, release_run: str | None = None) -> str | None:
    """A version of this very package that a crashed (or interrupted) release created but never finished.

    Never one whose release is still in flight: a release run still RUNNING under a live relctl (another
    promote of the same run, from another project folder on this machine) keeps its version; this one
    stops with exit 4 instead of finishing the other's version under it.
    """
    if not registry.model_exists(name):
        return None
    for mv in registry.find_versions(name, T.CONTENT_SHA256, content):
        if mv.tags.get(T.RELEASE_STATE) not in (REGISTERING, STOPPED):
            continue
        owner = mv.tags.get(T.RELEASE_RUN)
        if owner and owner != release_run and registry.release_in_flight(owner):
            raise RegistryError(f"{name} v{mv.version} is being registered by release run {owner}, still in "
                                "flight; not finishing it from here",
                                hint="one release of a run at a time: let that promote finish, then re-run this one")
        return str(mv.version)
    return None


def publish(registry: Registry, run: ReleaseRun, name: str, package: PackageManifest, lineage: dict[str, Any],
            extra: dict[str, Any], description: str, state: dict[str, str],
            numbers: dict[str, float] | None = None, details: dict[str, str] | None = None) -> str:
    """Log the package and its MLflow model to the release run and register them as a new version, its
    numbers as metrics of the version's LoggedModel."""
    run.set_tags(lineage_tags(lineage, package))
    # One stored copy of the weights (release/registry/package_links.py): the MLflow model holds them,
    # the release run's package/ everything else and a note of where the rest lives.
    info = log_model(run, package)
    linked = package_links.links(package.root, package.model_dir, info.verbatim) if info.model_id else {}
    run.log_artifacts(package.root, PACKAGE_ARTIFACT, skip=frozenset(linked))
    if linked:
        run.log_dict({"model_id": info.model_id, "files": linked}, package_links.LINKS_FILE)
    tags = version_tags(package, lineage, {T.RELEASE_RUN: run.run_id, T.RELEASE_RUNS: run.run_id, **state, **extra})
    registry.ensure_model(name, description=MODEL_INTRO)
    mv = registry.create_version(name, info.model_uri, run.run_id, tags, description, model_id=info.model_id)
    pause_point("register:version-created")
    registry.record_numbers(mv, run.run_id, numbers or {}, details or {})
    return str(mv.version)


def log_model(run: ReleaseRun, package: PackageManifest) -> LoggedModelRef:
    """The version's MLflow model, in the flavour its backend names (release/backends/base.py Flavour)."""
    backend = backend_of(package)
    flavour = backend.flavour()
    files = sorted(p for p in package.model_dir.iterdir() if p.is_file())
    flavoured = backend.flavour_model(package.model_dir)
    if flavoured is not None:
        logged = {flavour.model_file, *(p.name for p in flavoured.side_files)}
        extras = [str(p) for p in files if p.name not in logged] + [str(package.root / MANIFEST)]
        return run.log_flavour_model(flavour.kind, flavoured, extras, list(flavour.pip_requirements))
    return run.log_files_model([*files, package.root / MANIFEST],
                               {"backend": backend.id, "backend_version": backend.version(),
                                "pip_requirements": list(flavour.pip_requirements)})


class RegisterInputs(StageInputs):
    model: str
    content_sha256: str
    lineage: dict[str, Any]
    extra_tags: dict[str, Any]
    description: str
    # The release's numbers (validation, gate and memory figures) and digests, for the version's LoggedModel.
    numbers: dict[str, float] = Field(default_factory=dict)
    details: dict[str, str] = Field(default_factory=dict)
    # sha256 of each before-register gate's evidence file by its artifact path in the release run: the
    # signature's provenance vouches for them (the eval gate's per-sample results among them).
    evidence_sha256: dict[str, str] = Field(default_factory=dict)
    # production: released at once; candidate: registered and aliased `candidate` for an after-register
    # gate (the canary) to decide; none: registered only (relctl register without --production).
    target: Literal["production", "candidate", "none"] = "production"
    waits_for: str = "the canary"    # what a candidate waits for, as the progress line says it
    reason: str = "promoted"
    # The production version the gates compared with (None: there was none); NOT_CHECKED skips the check.
    expected_production: str | None = NOT_CHECKED
    package_dir: Path = location()


class RegisterResult(StageResult):
    version: str
    outcome: str                     # released | candidate | registered | unchanged
    resumed_version: bool = False    # a crashed release's version was found and finished
    aliases: dict[str, list[str | None]] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class RegisterStage(Stage[RegisterInputs, RegisterResult]):
    """Create (or find, after a crash) the version and move the aliases. Its state is the registry's."""

    name = "register"
    phase = "register"
    result_type = RegisterResult
    resumable = False

    def __init__(self, inputs: RegisterInputs, registry: Registry, run: ReleaseRun, package: PackageManifest,
                 signer: SigningKey | None = None, builder: str = "relctl promote", *,
                 require_approval: bool = False) -> None:
        super().__init__(inputs)
        self.registry, self.release, self.package = registry, run, package
        # Held here, never in the inputs: those are fingerprinted and written to the work folder. signer None:
        # `signing: off` (release_key refuses a signing-on project without a key before any stage runs).
        self.signer, self.builder, self.require_approval = signer, builder, require_approval

    def _sign(self) -> str:
        """Sign the package; what the version's card and `relctl.signed_by` say about it."""
        if self.signer is None:
            return "unsigned"
        i = self.inputs
        signed = provenance(i.model, self.package, i.lineage, i.extra_tags, self.release.run_id, self.builder,
                            i.evidence_sha256)
        # Binds the signature to this release: readers refuse it for a version another run registered.
        signed["require_approval"] = self.require_approval
        sign_package(self.package.root, self.signer, signed)
        return self.signer.fingerprint

    def run(self, out: Path) -> RegisterResult:
        i, registry = self.inputs, self.registry
        notes = registry.repair(i.model)
        current = registry.version_for(i.model, PRODUCTION) if registry.model_exists(i.model) else None
        if i.target != "none" and current is not None and current.tags.get(T.CONTENT_SHA256) == i.content_sha256:
            # Promoting what already serves is a no-op, not a new version that replaces its own twin.
            return RegisterResult(version=str(current.version), outcome="unchanged", notes=notes)
        now = str(current.version) if current is not None else None
        if i.target == "production" and i.expected_production != NOT_CHECKED and now != i.expected_production:
            raise transitions.production_moved(i.model, i.expected_production, now, "", "nothing was registered")
        version = unfinished_version(registry, i.model, i.content_sha256, self.release.run_id)
        resumed = version is not None
        if version is None:
            signed_by = self._sign()
            version = publish(registry, self.release, i.model, self.package, i.lineage, i.extra_tags,
                              f"{i.description}\n\n{signature_line(signed_by)}",
                              state=transitions.created_state(i.target), numbers=i.numbers,
                              details=i.details)
            registry.set_version_tag(i.model, version, T.SIGNED_BY, signed_by)
        else:
            notes.append(f"{i.model} v{version} was registered by a release that did not finish; finishing it")
            # This release's evidence replaces what the crashed one had recorded.
            # Adopted by this release: registering again (a canary cut short left it `stopped`).
            # The crashed release's run keeps the package: it stays first in the version's release runs.
            found = registry.get_version(i.model, version).tags
            transitions.adopt(registry, i.model, version, version_tags(self.package, i.lineage, {
                T.RELEASE_RUN: self.release.run_id, T.RELEASE_RUNS: T.with_release_run(found, self.release.run_id),
                **i.extra_tags}))
            registry.record_numbers(registry.get_version(i.model, version), self.release.run_id, i.numbers,
                                    i.details)
            registry.set_description(i.model, version, i.description)
        if i.target == "none":
            return RegisterResult(version=version, outcome="registered", resumed_version=resumed, notes=notes)
        if i.target == "candidate":
            move = transitions.nominate(registry, i.model, version, "candidate", i.reason, self.release.run_id)
            return RegisterResult(version=version, outcome="candidate", resumed_version=resumed,
                                  aliases=move.changes if move else {}, notes=notes)
        move, repaired = transitions.promote(registry, i.model, version, i.reason, self.release.run_id,
                                             i.expected_production)
        return RegisterResult(version=version, outcome="released", resumed_version=resumed,
                              aliases=move.changes if move else {}, notes=notes + repaired)

    def summary(self, result: RegisterResult) -> str:
        if result.outcome == "unchanged":
            return f"{self.inputs.model} v{result.version} already serves this package; nothing moved"
        if result.outcome == "registered":
            return f"{self.inputs.model} v{result.version} registered"
        if result.outcome == "candidate":
            return f"{self.inputs.model} v{result.version} is the candidate (waits for {self.inputs.waits_for})"
        previous = result.aliases.get(PREVIOUS, [None, None])[1]
        after = f" (previous: v{previous})" if previous else ""
        return f"{self.inputs.model} v{result.version} is production{after}"


def register_package(registry: Registry, package: PackageManifest, name: str, production: bool,
                     signer: SigningKey | None = None) -> tuple[str, str]:
    """Register a verified package on its own (`relctl register`): (version, release run id).

    The same RegisterStage as promote's, with lineage from the package manifest; no gate ran, so the
    version has no gate.<id>.status tags, and its card says so.
    """
    content = content_sha256(package)
    description = (f"# {name} — {package.data.get('precision')} {package.backend_id}\n\nRegistered with "
                   f"`relctl register` from a package (content sha256 `{content}`); no gate ran.")
    with registry.release_run(name, f"register {name} from {package.root.name}", {T.OUTCOME: "registered"}) as run:
        inputs = RegisterInputs(model=name, content_sha256=content, lineage=package.data.get("lineage", {}),
                                extra_tags={}, description=description,
                                target="production" if production else "none", reason="relctl register --production",
                                package_dir=package.root)
        with tempfile.TemporaryDirectory() as tmp:
            result = RegisterStage(inputs, registry, run, package, signer, "relctl register").run(Path(tmp))
    return result.version, run.run_id
