"""The layering the README's Architecture section states, checked on the source (every import statement,
at module level, inside functions and under TYPE_CHECKING alike), not by review."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted module) of every import in `path`, relative imports resolved."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            yield node.lineno, module
            for alias in node.names:  # `from release import api` imports release.commands.api
                yield node.lineno, f"{module}.{alias.name}"


def offenders(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in files:
        for line, module in imported(path):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return sorted(set(found))


def under(folder: str, *, but: tuple[str, ...] = ()) -> list[Path]:
    return [p for p in modules(folder) if not any(p.relative_to(ROOT).as_posix().startswith(b) for b in but)]


def test_release_never_imports_the_gate_plugins() -> None:
    # Gates are found through entry points, built-ins too; release/ holds the contract they implement.
    assert offenders(modules("release"), ("gates",)) == []


def test_only_the_registry_package_imports_mlflow() -> None:
    assert offenders(under("release", but=("release/registry/",)), ("mlflow",)) == []
    assert offenders(modules("gates"), ("mlflow",)) == []


def test_only_a_backend_opens_an_engines_model_folder() -> None:
    # The model folder is loaded in one place: the backend that built it.
    engines = ("onnxruntime_genai",)
    assert offenders(under("release", but=("release/backends/onnxruntime_genai/",)), engines) == []
    assert offenders(modules("gates"), engines) == []


def test_the_configuration_schema_points_down_only() -> None:
    """The schema reads no registry; it checks the spelling of a version it names (release.onto) with the one
    parser of MODEL@ALIAS / MODEL/VERSION, release/registry/refs.py: names, no MLflow."""
    config = [ROOT / "release" / "config.py"]
    found = offenders(config, ("release.serving", "release.pipeline", "release.commands", "release.stages",
                               "release.registry", "release.gating", "release.canary", "release.memory",
                               "release.adapters"))
    assert [f for f in found if not f.endswith(("imports release.registry.refs", ".refs.ONTO", ".refs.parse_ref"))] \
        == []


def test_refs_is_the_one_parser_of_a_version_spelling() -> None:
    """MODEL@ALIAS / MODEL/VERSION are parsed in release/registry/refs.py only, and it stays light: it imports
    nothing of the registry's client (MLflow), so the schema and the CLI read it before anything heavy."""
    refs = ROOT / "release" / "registry" / "refs.py"
    assert [m for _, m in imported(refs) if m.startswith(("release.", "mlflow"))
            and not m.startswith("release.core")] == []
    parsers = sorted(p.relative_to(ROOT).as_posix() for p in modules("release")
                     for node in ast.walk(ast.parse(p.read_text()))
                     if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                     and node.func.attr in ("partition", "rpartition", "split", "rsplit")
                     and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == "@")
    # store.py splits a tracking URI's user@host, not a version.
    assert parsers == ["release/registry/refs.py", "release/registry/store.py"], parsers


def test_adapters_sit_with_the_work() -> None:
    """release/adapters/ (the adapter feature: base match, package, validation, its table and rollback) uses the
    layers below it (core, registry, backends, signing, lora, stages, config, the canary it runs) and never
    reaches up into the commands, the CLI, the server that serves it, deploy, memory or the webhook; of the
    pipeline, only api.py (the adapter release's entry point, being folded into the pipeline) takes its work
    folders. Below it nothing imports it: core, registry, backends, signing, lora, stages, gating, memory,
    webhook, and the schema."""
    adapters = modules("release/adapters")
    found = offenders(adapters, ("release.commands", "release.cli", "release.serving", "release.deploy",
                                 "release.memory", "release.webhook"))
    # The one admin client (a37-serving's, in serving/) is a client of the server, not the server.
    assert [f for f in found if ".serving.admin_client" not in f] == []
    assert offenders(under("release/adapters", but=("release/adapters/api.py",)), ("release.pipeline",)) == []
    below = [p for folder in ("core", "registry", "backends", "signing", "lora", "stages", "gating", "memory",
                              "webhook") for p in modules(f"release/{folder}")] + [ROOT / "release" / "config.py"]
    assert offenders(below, ("release.adapters",)) == []


def test_register_stands_apart_from_the_runner_and_the_version_fetcher() -> None:
    register = [ROOT / "release" / "stages" / "register.py"]
    assert offenders(register, ("release.pipeline.runner", "release.registry.versions")) == []


def test_core_is_the_bottom_layer() -> None:
    for path in modules("release/core"):
        for line, module in imported(path):
            if module.startswith("release.") and not module.startswith("release.core"):
                pytest.fail(f"{path.relative_to(ROOT)}:{line} imports {module}, above release/core")


def test_the_layers_point_down() -> None:
    """commands -> pipeline -> the work (stages, serving, memory, canary, lora, gating, deploy) -> backends
    -> registry / core: nothing imports a layer above its own."""
    work = [p for folder in ("stages", "serving", "memory", "canary", "lora", "gating", "deploy", "webhook")
            for p in modules(f"release/{folder}") if p.name != "cli.py"]  # a feature's cli.py is a command
    assert offenders(work, ("release.commands", "release.cli")) == []
    assert offenders(modules("release/pipeline"), ("release.commands", "release.cli")) == []
    assert offenders(modules("release/registry"), ("release.commands", "release.cli", "release.pipeline",
                                                   "release.stages", "release.serving", "release.gating",
                                                   "release.canary", "release.memory", "release.backends")) == []


def test_the_root_holds_only_the_entry_point_and_the_schema() -> None:
    """The folder names show the architecture: every other module lives in its layer's package."""
    assert sorted(p.name for p in (ROOT / "release").glob("*.py")) == ["__init__.py", "cli.py", "config.py"]


def test_command_modules_are_named_cli() -> None:
    """One naming scheme: a package's click commands live in its cli.py (release/cli.py is the group)."""
    clickers = sorted(p.relative_to(ROOT).as_posix() for p in modules("release")
                      if "@click.command" in p.read_text() or "@click.group" in p.read_text())
    assert clickers and all(name.endswith("/cli.py") for name in clickers), clickers


def test_backends_reach_no_pipeline_or_command() -> None:
    # A backend is a leaf that the pipeline, the server and the registry call; it never calls them back.
    above = ("release.pipeline", "release.commands", "release.cli", "release.stages", "release.gating",
             "release.registry", "release.canary")
    assert offenders(modules("release/backends"), above) == []


def test_backends_reach_no_serving_or_memory_internals() -> None:
    """What a Runner exchanges with the server (Job, ModelLimits, ...) and what a plan is made of (Target,
    EnginePlan, the model's shape) are the contract's (release/backends/jobs.py, planning.py, shape.py): a
    plug-in engine imports nothing from the work above it."""
    assert offenders(modules("release/backends"), ("release.serving", "release.memory", "release.deploy",
                                                    "release.lora", "release.webhook", "release.signing")) == []
    toy = modules("tests/backends/toy_backend")
    assert toy and offenders(toy, ("release.serving", "release.memory", "release.pipeline", "release.stages")) == []


def test_the_schema_reaches_backends_only_through_discovery() -> None:
    """release.yaml is checked against what the installed backends offer, found through the entry points
    (release.backends) and their contract: never an engine's own package."""
    config = [ROOT / "release" / "config.py"]
    engine_packages = sorted({f"release.backends.{p.parent.name}" for p in modules("release/backends")
                              if p.name == "__init__.py" and p.parent.name != "backends"})
    assert engine_packages and offenders(config, tuple(engine_packages)) == []


def test_the_work_does_not_reach_up_into_the_pipeline() -> None:
    """The work (stages, serving, memory, canary, lora, gating, deploy, webhook) sits below the pipeline that
    orchestrates it: no import of release.pipeline from it, none excepted (fetch-and-verify of a released
    package is release/registry/versions.py, the progress line release/core/progress.py, lineage
    release/stages/lineage.py)."""
    work = [p for folder in ("stages", "serving", "memory", "canary", "lora", "gating", "deploy", "webhook")
            for p in modules(f"release/{folder}") if p.name != "cli.py"]
    assert offenders(work, ("release.pipeline",)) == []


def test_release_state_moves_have_one_home() -> None:
    """Every write of a version's release state goes through release/registry/transitions.py (its named
    transitions); no other module sets the state tag."""
    writers = sorted(p.relative_to(ROOT).as_posix() for p in modules("release")
                     if "T.RELEASE_STATE:" in p.read_text() or "T.RELEASE_STATE," in p.read_text())
    assert writers == ["release/registry/transitions.py"], writers


LEASE_CALLS = ("locked_move", "move_aliases", "record_event", "lock", "model_lock")


def lease_callers(paths: list[Path]) -> list[str]:
    """file:line of every call that takes a model's alias lease or composes an alias move under it."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if name in LEASE_CALLS:
                    found.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno} {name}")
    return found


def test_alias_moves_and_the_lease_have_one_home() -> None:
    """Every alias move (promote, register, the canary, approve, rollback) and every history entry is a named
    transition of release/registry/transitions.py: outside the registry's own client (which implements the
    lease) and transitions.py, nothing takes a model's lease or calls locked_move / move_aliases /
    record_event."""
    home = ("release/registry/transitions.py", "release/registry/client.py", "release/registry/lock.py")
    callers = [c for c in lease_callers(modules("release")) if not c.startswith(home)]
    assert callers == [], callers


def test_the_lease_checker_finds_a_planted_caller() -> None:
    planted = ROOT / "release" / "_planted_lease.py"
    planted.write_text("def f(registry, client):\n    registry.locked_move('m', dict, 'x', 'y', None)\n"
                       "    with model_lock(client, 'm', 'x'):\n        pass\n")
    try:
        assert lease_callers([planted]) == ["release/_planted_lease.py:2 locked_move",
                                            "release/_planted_lease.py:3 model_lock"]
    finally:
        planted.unlink()


@pytest.mark.parametrize("rule", ["gates", "mlflow"])
def test_the_checker_finds_a_planted_import(tmp_path: Path, rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules above can fail: a module that breaks one is named with its line."""
    planted = ROOT / "release" / f"_planted_{rule}.py"
    planted.write_text(f"def f() -> None:\n    from {rule} import base  # noqa\n")
    try:
        assert offenders([planted], (rule,)) == [f"release/_planted_{rule}.py:2 imports {rule}",
                                                 f"release/_planted_{rule}.py:2 imports {rule}.base"]
    finally:
        planted.unlink()
