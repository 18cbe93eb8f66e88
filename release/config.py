"""release.yaml: one schema for a release, unknown keys rejected with a did-you-mean hint.

`relctl promote` works with no file at all: every field has a default that suits the example run.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from release.core.errors import ConfigError, InputError, InputProblems
from release.core.jsonfile import load_yaml
from release.core.model_name import bad_model_name
from release.core.server_settings import ServerSettings

CONFIG_FILE = "release.yaml"
# Keys that were replaced: the message says by what, instead of a did-you-mean guess.
RENAMED = {"convert.exporter": "use convert.backend: auto, or a backend id (relctl backends lists them); the "
                               "torch exporter was removed: it built models nothing served",
           "serving.workspace_fraction": "remove it: each engine's memory plan computes its own activations "
                                         "(relctl plan shows them)"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceConfig(Strict):
    artifact_path: str = Field("checkpoint", description="run artifact folder holding the HF checkpoint")


class MergeConfig(Strict):
    enabled: bool = Field(True, description="fold a PEFT adapter found in the checkpoint into the base")


class ConvertConfig(Strict):
    # Precisions, backends and providers are whatever the installed backends offer (release/backends/):
    # checked here, at config time, against them, so there is one source for each choice. Besides these
    # fields, `convert.<backend id>` is that backend's own block, checked against its `settings_model`.
    precision: str = Field("int4", description="serving precision, one an installed backend builds (relctl backends), "
                                               "or auto: the cheapest variant that passes (docs/precision-auto.md)")
    backend: str = Field("auto", description="serving engine: auto (the first installed backend that supports the "
                                             "checkpoint's family) or a backend id (relctl backends)")
    execution_provider: str = Field("cpu", description="the device the model is built for (cpu, cuda, ...)")
    fp16_overflow: Literal["refuse", "warn"] = Field(
        "refuse", description="a weight above 65504 becomes Inf at fp16: refuse the release (exit 2) or warn")
    _engines: dict[str, BaseModel] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _engine_blocks(cls, data: Any, handler: Any) -> Any:
        """`convert.<id>` of an installed backend with a settings model is that backend's block, validated by
        it; every other key is checked as usual (an unknown one is refused with a did-you-mean hint)."""
        blocks: dict[str, Any] = {}
        takes: dict[str, type[BaseModel]] = {}
        if isinstance(data, dict):
            from release.backends import available_backends  # noqa: PLC0415 - entry points, only when validated

            takes = {b.id: b.settings_model for b in available_backends().values() if b.settings_model is not None}
            blocks = {key: data[key] for key in data if key in takes}
            data = {key: value for key, value in data.items() if key not in takes}
        config = handler(data)
        for key, block in blocks.items():
            try:
                config._engines[key] = takes[key].model_validate(block or {})
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                raise ValueError(f"{key}.{where}: {first['msg']}") from exc
        return config

    def engine_settings(self, backend_id: str) -> BaseModel | None:
        """The validated `convert.<backend_id>` block, or None when release.yaml has none."""
        return self._engines.get(backend_id)

    def engines(self) -> dict[str, BaseModel]:
        """Every `convert.<backend id>` block release.yaml gives, validated."""
        return dict(self._engines)

    @field_validator("precision")
    @classmethod
    def _known_precision(cls, value: str) -> str:
        return _known_or_auto(value)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        from release.backends import AUTO, available_backends, broken_backends  # noqa: PLC0415 - as above

        if value in broken_backends():   # installed but failed to load: say so, with its entry point and error
            raise ValueError(broken_backends()[value])
        return _one_of("backend", value, [AUTO, *available_backends()])

    @field_validator("execution_provider")
    @classmethod
    def _known_provider(cls, value: str) -> str:
        from release.backends import available_backends  # noqa: PLC0415 - as above

        providers = [p for b in available_backends().values() for p in b.execution_providers]
        return _one_of("execution provider", value, list(dict.fromkeys(providers)))


def _known_or_auto(value: str) -> str:
    """A precision an installed backend builds, a variant of one (`int4+algo=k_quant`: its options are checked
    by the backend's target_problem with the rest of the contract), or `auto`: the cheapest variant that passes
    (release/pipeline/precision_search.py)."""
    from release.backends import installed_precisions  # noqa: PLC0415 - entry points, only when validated
    from release.backends.variants import AUTO_PRECISION, parse_variant  # noqa: PLC0415

    if value == AUTO_PRECISION:
        return value
    try:   # the grammar first: "int4+" or "int4+int8=" is the user's to fix (exit 2), named with its key
        variant = parse_variant(value)
    except InputError as exc:
        raise ValueError(f"{exc.message} ({exc.hint})") from exc
    _one_of("precision", variant.precision, [*installed_precisions(), AUTO_PRECISION])
    return value


def _one_of(what: str, value: str, choices: list[str]) -> str:
    if value not in choices:
        raise ValueError(f"{what} '{value}' is not offered by the installed backends; choose one of "
                         f"{', '.join(choices)}")
    return value


class ValidationConfig(Strict):
    prompts: str | None = Field(
        None, description="JSONL of {'prompt': ...}; default: the run's validation/prompts.jsonl artifact"
    )
    min_top1_agreement: float = Field(0.90, ge=0, le=1, description="tie-aware: over distinct token prefixes where "
                                      "the reference's top two tokens are more than near_tie_nats apart")
    near_tie_nats: float = Field(0.05, ge=0, description="top-1 agreement leaves out positions where the reference's "
                                 "top two log-probabilities are within this (a near-tie: either token is its answer); "
                                 "0 counts every distinct prefix")
    max_mean_kl: float = Field(0.10, ge=0)
    max_perplexity_increase: float = Field(0.05, ge=0, description="relative, 0.05 = +5%")
    min_greedy_agreement: float = Field(0.80, ge=0, le=1)
    max_new_tokens: int = Field(16, ge=1, le=512)


class ServingConfig(Strict):
    concurrency: int = Field(8, ge=1, description="concurrent sequences per replica")
    context_tokens: int = Field(512, ge=1, description="prompt + output tokens per sequence")
    gpu_memory_gib: float = Field(24.0, gt=0, description="memory of one accelerator (or host RAM on CPU)")
    rollout_replicas: int = Field(2, ge=1, description="replicas side by side during a rolling update")
    server: ServerSettings = Field(default_factory=ServerSettings, description="relctl serve: limits, queue, logs")


class SigningConfig(Strict):
    # Paths, relative to release.yaml's folder. The private key is a secret: only its path is ever named.
    # Signing is on unless release.yaml says `signing: off`: every release is signed and every registered
    # version verified (release/signing/keys.py); `relctl keygen` makes the key pair at the default paths.
    enabled: bool = Field(True, description="sign every release and verify every version; `signing: off` (the "
                                            "whole block) releases unsigned and says so everywhere")
    key: str | None = Field(None, description="PEM EC private key (P-256/384/521) that signs each release, outside "
                                              "git (mode 0600); default .relctl/keys/release.pem (relctl keygen); "
                                              "RELCTL_SIGNING_KEY (a path, the PEM, or base64 PEM) overrides it")
    trusted_keys: list[str] = Field(default_factory=list, description="PEM public keys whose signatures serve, "
                                                                     "roll back and canary (plus RELCTL_TRUSTED_KEYS); "
                                                                     "default keys/release.pub (committed)")
    unsigned: Literal["refuse", "warn"] = Field(
        "refuse", description="registered versions without a signature (released before signing): refuse them "
                              "(serve, rollback, canary, gates) or warn; a package folder is always served with a "
                              "warning")


class EngineConfig(Strict):
    """One entry of `engines:`: an engine and precision the release is measured on beside the others."""

    backend: str = Field(description="a backend id (relctl backends lists them)")
    precision: str = Field(description="a precision that backend builds, or auto: each variant it builds")
    gpu_price_per_hour: float | None = Field(
        None, gt=0, description="this engine's accelerator price per hour; default gates.load.cost's")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        from release.backends import available_backends  # noqa: PLC0415 - entry points, only when validated

        return _one_of("backend", value, list(available_backends()))

    @field_validator("precision")
    @classmethod
    def _known_precision(cls, value: str) -> str:
        return _known_or_auto(value)


class ModeConfig(Strict):
    """`release:` what kind of release this is. `mode: adapter` is `relctl promote RUN --onto ONTO`."""

    mode: Literal["merged", "adapter"] = Field(
        "merged", description="merged: the adapter folded into its base, a whole model released; adapter: the run's "
                              "LoRA released onto the serving base `onto`, unmerged (docs/adapters.md)")
    onto: str | None = Field(None, description="mode adapter: the serving base, MODEL@ALIAS or MODEL/VERSION (as "
                                               "promote --onto); `model` then names the adapter's registered model")
    strand_adapters: bool = Field(
        False, description="mode merged: release even when production moves off a version that production adapters "
                           "were built for (they serve on no production base until released onto the new one); "
                           "default: refused, exit 2 naming them, before any slow stage (as promote --strand-adapters)")

    @field_validator("onto")
    @classmethod
    def _target(cls, value: str | None) -> str | None:
        if value is not None:
            from release.registry.refs import ONTO, parse_ref  # noqa: PLC0415 - only when an adapter is named

            try:
                parse_ref(value, ONTO)
            except InputError as exc:
                raise ValueError(f"{exc.message.removeprefix('--onto').lstrip(': ')}; {exc.hint}") from exc
        return value

    @model_validator(mode="after")
    def _onto_with_adapter(self) -> ModeConfig:
        if self.mode == "adapter" and self.onto is None:
            raise ValueError("mode adapter needs onto: the serving base, e.g. onto: tiny-llm@production")
        if self.mode == "merged" and self.onto is not None:
            raise ValueError("onto is for mode: adapter (an adapter released onto a serving base); add mode: adapter "
                             "or remove onto")
        return self


class ReleaseConfig(Strict):
    model: str | None = Field(None, description="registered model name (letters, digits, '.', '_', '-'); "
                                                "default: the run's experiment name (release.mode adapter: the "
                                                "adapter's own model, default BASE-EXPERIMENT)")
    release: ModeConfig = ModeConfig()
    source: SourceConfig = SourceConfig()
    _file: str = PrivateAttr(default=CONFIG_FILE)   # the file errors name: release.yaml, or the -c file's name
    merge: MergeConfig = MergeConfig()
    convert: ConvertConfig = ConvertConfig()
    validation: ValidationConfig = ValidationConfig()
    serving: ServingConfig = ServingConfig()
    signing: SigningConfig = SigningConfig()
    require_approval: bool = Field(
        False, description="a version that passed its gates waits as `candidate` (state awaiting-approval; production "
                           "unmoved) until `relctl approve MODEL/VERSION --reason ...` records who approved it")
    # Engines side by side (release/pipeline/engines.py): each is built, validated and load-tested on the
    # same prompts and seeded load plan (gates.load); with convert.backend: auto the cheapest that meets
    # quality and the SLOs is released, otherwise convert's engine is and the table is evidence.
    engines: list[EngineConfig] = Field(
        default_factory=list, description="engines to compare on one load plan: [{backend, precision}, ...]")
    require: list[str] = Field(
        default_factory=list,
        description="gate ids that must be configured and must pass (not skip) for a release, e.g. [eval, safety]")
    # Each gate validates its own block (gates/<id>.py); unknown gate ids are refused there. Last: the starter
    # release.yaml writes it as the commented-out tail of the file.
    gates: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("signing", mode="before")
    @classmethod
    def _signing_off(cls, value: Any) -> Any:
        # YAML 1.1 reads `signing: off` as false; the string form is accepted as well.
        if value is False or (isinstance(value, str) and value.strip().lower() == "off"):
            return {"enabled": False}
        return value

    @field_validator("engines")
    @classmethod
    def _distinct_engines(cls, value: list[EngineConfig]) -> list[EngineConfig]:
        seen = [(e.backend, e.precision) for e in value]
        twice = next((pair for pair in seen if seen.count(pair) > 1), None)
        if twice is not None:
            raise ValueError(f"{twice[0]} at {twice[1]} is listed twice; list each engine and precision once")
        return value

    @field_validator("model")
    @classmethod
    def _model_name(cls, value: str | None) -> str | None:
        why = None if value is None else bad_model_name(value)
        if why is not None:
            raise ValueError(why)
        return value

    @model_validator(mode="after")
    def _adapter_is_its_own_model(self) -> ReleaseConfig:
        # An adapter registered under its base's name would become a version of the base: refused here.
        if self.release.onto is not None and self.model is not None:
            from release.registry.refs import ONTO, parse_ref  # noqa: PLC0415 - as in ModeConfig

            if parse_ref(self.release.onto, ONTO).model == self.model:
                raise ValueError(f"model '{self.model}' is the base that release.onto names; an adapter is its own "
                                 f"registered model: set model to e.g. {self.model}-support, or remove it")
        return self

    def adapter_onto(self, given: str | None) -> str | None:
        """The base an adapter release goes onto: `--onto` (`given`) or release.onto; None for a merged release.
        InputError (exit 2) when both name a base and disagree."""
        mine = self.release.onto if self.release.mode == "adapter" else None
        if given is not None and mine is not None and given != mine:
            raise InputError(f"--onto {given} disagrees with release.yaml's release.onto {mine}",
                             hint="drop --onto (release.yaml names the base) or make the two the same")
        return given or mine


def config_path(project_dir: Path, given: Path | None) -> Path | None:
    """The release.yaml a project command reads: `-c FILE` resolved against the project folder (as the default
    PROJECT_DIR/release.yaml is, so `--project-dir` means the same for both; an absolute FILE as it is), else
    PROJECT_DIR/release.yaml when it exists, else None (built-in defaults)."""
    if given is None:
        default = project_dir / CONFIG_FILE
        return default if default.is_file() else None
    return given if given.is_absolute() else project_dir / given


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> ReleaseConfig:
    """Parse release.yaml at `path` (None: defaults only), then apply dotted-key `overrides`. Every error names
    the file by its own name (a `-c staging.yaml` is not called release.yaml)."""
    data: dict[str, Any] = {}
    label = path.name if path else CONFIG_FILE
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"{path}: no such config file",
                              hint="-c FILE is read relative to the project folder (--project-dir) unless absolute; "
                                   "without -c, PROJECT_DIR/release.yaml is read when it exists")
        try:   # one loader: UTF-8, bounded size and depth, a key given twice refused (not last-one-wins)
            loaded = load_yaml(path, hint=f"fix {label} (see templates/release.yaml)", label=label) or {}
        except InputError as exc:
            raise ConfigError(exc.message, hint=exc.hint) from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{label}: top level must be a mapping", hint="see templates/release.yaml")
        data = loaded
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    try:
        config = ReleaseConfig.model_validate(data)
    except ValidationError as exc:
        raise _config_error(label, exc) from exc
    config._file = label
    for backend_id, settings in config.convert.engines().items():
        # Each backend applies its own block now, before anything slow (e.g. an engine's python, handed to
        # the engine processes relctl starts).
        from release.backends import get_backend  # noqa: PLC0415 - entry points, only when configured

        get_backend(backend_id).configure(settings, path.parent if path else Path.cwd(), label)
    return config


def config_label(config: ReleaseConfig) -> str:
    """The name of the file `config` was read from (release.yaml for the defaults): what its errors name."""
    return config._file


def named(message: str, file: str) -> str:
    """`message` naming `file` where it names release.yaml at its start (a gate's or the contract's problem
    about a -c file says which file)."""
    prefix = f"{CONFIG_FILE}:"
    return f"{file}:{message[len(prefix):]}" if file != CONFIG_FILE and message.startswith(prefix) else message


@contextmanager
def errors_name(file: str) -> Iterator[None]:
    """InputErrors raised inside name `file` instead of release.yaml (see `named`)."""
    try:
        yield
    except InputError as exc:
        exc.message = named(exc.message, file)
        exc.args = (exc.message,)
        if isinstance(exc, InputProblems):
            exc.problems = [(named(m, file), h) for m, h in exc.problems]
        raise


def gate_settings(path: Path, gate_id: str) -> dict[str, Any]:
    """The `gates.<gate_id>` block of the release.yaml at `path` ({} when the block is absent), read and
    checked by the same loader as everything else in the file: one parser for release.yaml."""
    block = load_config(path).gates.get(gate_id)
    return dict(block or {})


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def _config_error(label: str, exc: ValidationError) -> ConfigError:
    """Every problem pydantic found, at once: one error and hint line each (the README promises it)."""
    problems = [_problem(label, err) for err in exc.errors()]
    first, hint = problems[0]
    error = ConfigError(first if len(problems) == 1 else f"{first} (and {len(problems) - 1} more)", hint=hint)
    # The error printer shows each of `problems` as its own error/hint pair (as InputProblems does).
    error.problems = problems  # type: ignore[attr-defined]
    return error


def _problem(label: str, err: Any) -> tuple[str, str]:
    loc = [str(p) for p in err["loc"]]
    where = ".".join(loc)
    if where in RENAMED:
        return f"{label}: '{where}' is no longer a key", RENAMED[where]
    if err["type"] == "extra_forbidden":
        model: type[BaseModel] = ReleaseConfig
        for part in loc[:-1]:
            field = model.model_fields.get(part)
            ann = field.annotation if field else None
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                model = ann
        close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1)
        hint = f"did you mean '{'.'.join([*loc[:-1], close[0]])}'?" if close else (
            f"known keys here: {', '.join(model.model_fields)}"
        )
        return f"{label}: unknown key '{where}'", hint
    # pydantic words a validator's own message "Value error, ..."; the message is the useful part.
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{label}: {where + ': ' if where else ''}{message}", "see templates/release.yaml for the schema"
