"""The one parser of a registered version as people write it: `MODEL@ALIAS` (an alias, read when used) or
`MODEL/VERSION` (a version number), and where a command takes them `models:/MODEL/VERSION`,
`models:/MODEL@ALIAS` and `MODEL:VERSION` (a served name: X-Relctl headers, request logs, pinned adapters).

Every command that names a version (promote --onto and release.yaml's release.onto, serve, verify, approve,
render kserve, trace, serve --adapter-package) parses it here, before any registry call, and refuses what it
does not take with its own words (`Spelling`): one structure, one rule for the names in it
(release/core/model_name.py), one alias rule. No MLflow here: release.config and the CLI import it before
anything heavy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from release.core.errors import InputError
from release.core.model_name import check_model_name, check_version_number

MODELS_URI = "models:/"
ALIAS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


@dataclass(frozen=True)
class ModelRef:
    """A registered version by alias or by number (exactly one of the two is set)."""

    model: str
    alias: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        return f"{self.model}@{self.alias}" if self.alias else f"{self.model}/{self.version}"

    @property
    def name(self) -> str:
        """The registered model (what release/serving/source.py's VersionRef called `name`)."""
        return self.model


@dataclass(frozen=True)
class Spelling:
    """Which spellings one command takes, and its words for what it refuses. Messages are formatted with
    `{spec}` (what was given) and, for `bad_alias`, `{alias}`."""

    unknown: str                    # none of the spellings this command takes
    hint: str
    label: str = "{spec}"           # where a bad model name or version number is said to come from
    aliases: bool = True            # MODEL@ALIAS
    models_uri: bool = False        # models:/MODEL/VERSION, models:/MODEL@ALIAS
    served_name: bool = False       # MODEL:VERSION (registered model names never hold ':')
    any_name: bool = False          # a name MLflow holds that relctl would not choose (a read: serve, verify)
    no_alias: str | None = None     # an alias where only a version will do (None: the `unknown` words)
    no_alias_hint: str | None = None
    bad_alias: str | None = None    # an alias that is no alias name (None: the `unknown` words)


def parse_ref(spec: str, spelling: Spelling) -> ModelRef:
    """The version `spec` names, or InputError (exit 2) in `spelling`'s words; no registry call."""
    body = spec.removeprefix(MODELS_URI) if spelling.models_uri else spec
    label = spelling.label.format(spec=spec)

    def refuse(template: str | None, hint: str | None = None, **extra: str) -> InputError:
        return InputError((template or spelling.unknown).format(spec=spec, **extra), hint=hint or spelling.hint)

    def named(model: str) -> str:
        if spelling.any_name:  # a read names what the registry holds; an empty name is no spelling at all
            if not model:
                raise refuse(None)
            return model
        return check_model_name(model, label)

    if "@" in body:
        model, _, alias = body.partition("@")
        if not spelling.aliases:
            raise refuse(spelling.no_alias, spelling.no_alias_hint)
        if not ALIAS_NAME.fullmatch(alias):
            raise refuse(spelling.bad_alias, alias=alias)
        return ModelRef(named(model), alias=alias)
    separator = ":" if spelling.served_name and ":" in body else "/"
    model, sep, version = body.rpartition(separator)
    if not sep or not model or not version.isascii() or not version.isdigit():
        raise refuse(None)
    return ModelRef(named(model), version=check_version_number(version, label))


def parse_version(spec: str, spelling: Spelling) -> tuple[str, str]:
    """(model, version) of a spec that must name a version number (an alias is refused)."""
    ref = parse_ref(spec, spelling)
    assert ref.version is not None  # a spelling without aliases yields a version
    return ref.model, ref.version


# The commands' spellings, here so that one reading of each is shared by every caller.
ONTO = Spelling(unknown="--onto {spec!r} names no base version",
                hint="name the serving base as MODEL@production (an alias) or MODEL/3 (a version)",
                label="--onto", bad_alias="--onto {spec!r}: '{alias}' is not an alias name")
SERVE_HELP = "a package folder, MODEL@ALIAS, MODEL/VERSION, models:/MODEL@ALIAS or models:/MODEL/VERSION"
SERVE = Spelling(unknown="{spec}: no such package folder, and not a registered version", hint=f"pass {SERVE_HELP}",
                 models_uri=True, any_name=True)
SERVE_URI = Spelling(unknown="{spec}: expected models:/MODEL/VERSION or models:/MODEL@ALIAS",
                     hint="e.g. relctl serve models:/my-model/3", models_uri=True, any_name=True)
APPROVE = Spelling(unknown="{spec}: expected MODEL/VERSION (a version number)",
                   hint="e.g. relctl approve my-model/3 --reason 'reviewed the eval report'", aliases=False)
PINNED = Spelling(unknown="{spec}: expected MODEL/VERSION (or models:/MODEL/VERSION) with a numeric version",
                  hint="e.g. relctl render kserve tiny-llm/3", aliases=False, models_uri=True,
                  no_alias="{spec}: an alias is resolved when a pod starts, so it is not a pinned version",
                  no_alias_hint="pass MODEL/VERSION; `relctl status MODEL` shows which version each alias points at")
ADAPTER_PACKAGE = Spelling(unknown="--adapter-package {spec!r}: expected MODEL/VERSION (a version number) before '='",
                           hint="e.g. --adapter-package tiny-llm-support/2=/mnt/models/adapters/tiny-llm-support",
                           label="--adapter-package", aliases=False)
PINNED_NAME = Spelling(unknown="{spec!r}: a pinned adapter is served as MODEL:VERSION with a version number",
                       hint="e.g. tiny-llm-support:2 (GET /admin/adapters lists what is served)", aliases=False,
                       served_name=True, any_name=True)
TRACE = Spelling(unknown="'{spec}' is not MODEL:VERSION, a headers file or --response-id",
                 hint="e.g. relctl trace tiny-llm:3, or relctl trace headers.txt", aliases=False, served_name=True,
                 any_name=True)


def serve_ref(spec: str) -> ModelRef:
    """What `relctl serve` and `relctl verify` take that is not a folder."""
    return parse_ref(spec, SERVE_URI if spec.startswith(MODELS_URI) else SERVE)
