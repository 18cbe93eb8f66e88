"""`relctl trace`: from a served response back to the training run that made it.

A response of `relctl serve` names its version in the X-Relctl-Model / X-Relctl-Version /
X-Relctl-Serving-Config headers (and its id is in the request log). From there: the version, its
serving-config hash, the release run and its gate results, the training run, git commit, data and
weight hashes — and whether the package still matches, file by file, what the registry recorded, and
who signed it, with the provenance the signature covers (release/signing).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from release.core.errors import InputError, RegistryError
from release.core.jsonfile import read_jsonl
from release.registry import Registry, links
from release.registry import tags as T
from release.registry.refs import TRACE, parse_version
from release.registry.versions import fetch_verified
from release.signing.keys import Trust


def parse_headers(text: str) -> dict[str, str]:
    """HTTP response headers as `curl -D` or a browser writes them (`Name: value` lines), lower-cased."""
    headers = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and not name.startswith(("HTTP/", " ")):
            headers[name.strip().lower()] = value.strip()
    return headers


def target_from_headers(text: str) -> tuple[str, str, str | None]:
    headers = parse_headers(text)
    model, version = headers.get("x-relctl-model"), headers.get("x-relctl-version")
    if not model or not version:
        raise InputError("the headers hold no X-Relctl-Model and X-Relctl-Version",
                         hint="save the response headers of relctl serve, e.g. curl -D headers.txt ...")
    if version == "unregistered":
        raise InputError(f"{model} was served from a package folder, not a registered version",
                         hint="serve MODEL@ALIAS or MODEL/VERSION to make responses traceable")
    adapter, adapter_version = headers.get("x-relctl-adapter"), headers.get("x-relctl-adapter-version")
    if adapter and adapter_version:
        # An answer generated with a LoRA adapter: its training run is the adapter's (the chain names the
        # base version it ran on); the serving-config header is the base's, so it is not compared.
        return adapter, adapter_version, None
    return model, version, headers.get("x-relctl-serving-config")


def target_from_log(log_dir: Path, response_id: str) -> tuple[str, str, str | None]:
    for path in sorted(log_dir.glob("requests-*.jsonl"), reverse=True):
        for _, record in read_jsonl(path, hint="the request logs are relctl serve's; pass its --log-dir"):
            if isinstance(record, dict) and record.get("id") == response_id:
                model, _, version = str(record.get("model", "")).rpartition(":")
                return model, version, record.get("serving_config")
    raise InputError(f"response '{response_id}' is not in the request logs under {log_dir}",
                     hint="request logging is off by default (serving.server.request_log.enabled)")


def parse_spec(spec: str) -> tuple[str, str]:
    """MODEL:VERSION (a served name) or MODEL/VERSION (release/registry/refs.py)."""
    return parse_version(spec, TRACE)


def trace(registry: Registry, model: str, version: str, served_config: str | None = None,
          trust: Trust | None = None) -> dict[str, Any]:
    """The whole chain for `model` v`version`, with the package verified against the registry."""
    mv = registry.get_version(model, version)
    tags = dict(mv.tags)
    uri = registry.store.tracking_uri
    out: dict[str, Any] = {"schema_version": 1, "model": model, "version": version,
                           "model_uri": links.model_uri(model, version),
                           "link": links.version_link(uri, model, version),
                           "aliases": sorted(mv.aliases),  # the version carries its aliases: no read of the model
                           "serving_config_hash": tags.get(T.SERVING_CONFIG_HASH), "precision": tags.get(T.PRECISION),
                           "engine": T.engine_of(tags)}
    if served_config is not None and served_config != tags.get(T.SERVING_CONFIG_HASH):
        out["serving_config_mismatch"] = f"the response said {served_config}, the version records " \
                                         f"{tags.get(T.SERVING_CONFIG_HASH)}"
    release_run = tags.get(T.RELEASE_RUN)
    lineage = dict(tags)  # versions registered before schema 3 carry their whole lineage as tags
    if release_run:
        run = registry.get_run(release_run)
        out["release_run"] = {"id": release_run, "outcome": run.tags.get(T.OUTCOME),
                              "link": links.run_link(uri, run.experiment_id, release_run)}
        lineage = {**run.tags, **tags}
        # Gated again after it was registered: the run above is the latest gating; the first registered the
        # package (and holds it). Every one is listed, oldest first.
        history = T.release_runs(tags)
        if len(history) > 1:
            out["release_runs"] = [{"id": r, "role": "registered the package" if i == 0 else "gated it again",
                                    "link": links.run_link(uri, run.experiment_id, r)}
                                   for i, r in enumerate(history)]
    out["gates"] = T.gate_statuses(tags)
    if tags.get(T.KIND) == "adapter":
        out["adapter_of"] = {"model": tags.get(T.BASE_MODEL), "version": tags.get(T.BASE_VERSION),
                             "base_sha256": tags.get(T.BASE_SHA256)}
    training_id = tags.get(T.TRAINING_RUN)
    training: dict[str, Any] = {"id": training_id}
    if training_id:
        try:
            run = registry.get_run(training_id)
            training |= {"name": run.run_name, "link": links.run_link(uri, run.experiment_id, training_id)}
        except (InputError, RegistryError) as exc:
            training["error"] = exc.message
    training |= {"git_commit": lineage.get(T.GIT_COMMIT), "git_dirty": lineage.get(T.GIT_DIRTY)}
    out["training_run"] = training
    out["data_sha256"] = {k.removesuffix(T.SHA256_SUFFIX): v
                          for k, v in T.with_prefix(lineage, T.DATA_PREFIX).items()}
    out["weights_sha256"] = {k.removesuffix(T.SHA256_SUFFIX): v
                             for k, v in T.with_prefix(lineage, T.WEIGHTS_PREFIX).items()}
    out["config_sha256"] = lineage.get(T.CONFIG_SHA256)
    trust = trust or Trust()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            _package, verdict = fetch_verified(registry, model, version, Path(tmp), mv, trust=trust,
                                               warn=lambda _: None)
            checked = f"every file against the manifest recorded at release ({tags.get(T.MANIFEST_SHA256, '')[:16]})"
            if verdict.status == "verified":
                checked += f" and the signature by {verdict.signed_by} ({str(verdict.fingerprint)[:16]})"
            out["integrity"] = {"ok": True, "checked": checked}
            out["signature"] = {"status": verdict.status, "signed_by": verdict.signed_by,
                                "fingerprint": verdict.fingerprint, "note": verdict.note}
            out["provenance"] = verdict.provenance
        except InputError as exc:
            out["integrity"] = {"ok": False, "problem": exc.message}
    return out


def render(chain: dict[str, Any]) -> list[str]:
    """The chain as text, one fact per line."""
    lines = [f"{chain['model']} v{chain['version']} ({chain['model_uri']}; aliases: "
             f"{', '.join(chain['aliases']) or 'none'})",
             f"  engine           {chain.get('engine') or 'not recorded'} at "
             f"{chain['precision'] or 'unknown precision'}",
             f"  serving config   {chain['serving_config_hash'] or 'not recorded'}"]
    if "serving_config_mismatch" in chain:
        lines.append(f"  MISMATCH         {chain['serving_config_mismatch']}")
    rr = chain.get("release_run")
    if rr:
        lines.append(f"  release run      {rr['id']} ({rr['outcome'] or 'outcome not recorded'}) {rr['link']}")
    for earlier in chain.get("release_runs", [])[:-1]:
        lines.append(f"  earlier run      {earlier['id']} ({earlier['role']}) {earlier['link']}")
    gates = ", ".join(f"{g} {s}" for g, s in sorted(chain["gates"].items())) or "no gate ran"
    lines.append(f"  gates            {gates}")
    t = chain["training_run"]
    lines.append(f"  training run     {t.get('id') or 'not recorded'} {t.get('link', '')}".rstrip())
    lines.append(f"  git commit       {t.get('git_commit') or 'not recorded'}"
                 + (" (uncommitted changes)" if str(t.get("git_dirty")).lower() == "true" else ""))
    lines += [f"  data {name:<12}sha256 {digest}" for name, digest in sorted(chain["data_sha256"].items())]
    lines += [f"  weights {name} sha256 {digest}" for name, digest in sorted(chain["weights_sha256"].items())]
    integrity = chain["integrity"]
    verdict = f"verified: {integrity['checked']}" if integrity["ok"] else f"TAMPERED: {integrity['problem']}"
    lines.append(f"  package          {verdict}")
    signature = chain.get("signature")
    if signature:
        lines.append(f"  signature        {signature['status']}"
                     + (f" by {signature['signed_by']} ({str(signature['fingerprint'])[:16]})"
                        if signature["signed_by"] else f" ({signature['note']})"))
    provenance = chain.get("provenance") or {}
    for key in ("release_run", "relctl_version", "code_commit", "gates"):
        if key in provenance:
            value = provenance[key]
            shown = ", ".join(f"{k} {v}" for k, v in sorted(value.items())) if isinstance(value, dict) else value
            lines.append(f"  {'signed ' + key:<17}{shown}" if len(key) < 10 else f"  signed {key} {shown}")
    return lines
