"""Adapter operations beside the release itself: `release.mode: adapter` in release.yaml (the same release as
`promote RUN --onto`, refused for bad input and for a wrong base before any slow stage), and `relctl render
kserve` of a base with its production adapters, each pinned by digest.

The release.yaml tests are cheap (tags-only base versions, as tests/adapters/test_base_match.py makes them:
no engine starts). The render test reads the package's vLLM story (tests/adapters/conftest.py) and writes
nothing into its registry.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from release.cli import cli
from release.core.weights_digest import folder_base_digest
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from tests.adapters.test_base_match import BASE, base_version, other_base
from tests.conftest import load_train_module

ADAPTER_MODE = f"release:\n  mode: adapter\n  onto: {BASE}@production\n"


def relctl(project: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


def test_release_yaml_adapter_mode_refuses_a_wrong_base_by_digest(tiny_run: Any, project_dir: Path,
                                                                   tmp_path: Path) -> None:
    """`release.mode: adapter` is `promote --onto`: a run trained on other weights is exit 2 in seconds, from
    promote and from check alike, naming both digests and both versions; nothing is registered."""
    served = folder_base_digest(tiny_run.checkpoint_dir)
    wrong = other_base(tiny_run, tmp_path)
    trained_on = folder_base_digest(wrong.checkpoint_dir)
    v1 = base_version(project_dir, trained_on)
    v2 = base_version(project_dir, served)
    (project_dir / "release.yaml").write_text(f"model: {BASE}-support\n{ADAPTER_MODE}")
    run_id = load_train_module().log_run(wrong, project_dir, experiment="support")
    started = time.monotonic()
    result = relctl(project_dir, "promote", run_id)
    print(f"wrong-base adapter (release.yaml) refused in {time.monotonic() - started:.2f}s")
    assert result.exit_code == 2, result.output
    error = result.stderr.splitlines()[0]
    assert trained_on in error and served in error and f"{BASE} v{v1}" in error and f"{BASE} v{v2}" in error
    checked = relctl(project_dir, "check", run_id, "--json")
    assert checked.exit_code == 2, checked.output
    report = json.loads(checked.stdout)
    assert report["found"]["base"] is False
    assert any(trained_on in p["error"] and served in p["error"] for p in report["problems"])
    registry = Registry(resolve_store(project_dir))
    assert not registry.model_exists(f"{BASE}-support") and registry.aliases(BASE)["production"] == v2


def test_release_yaml_adapter_mode_checks_a_matching_run(tiny_run: Any, project_dir: Path) -> None:
    """The run that trained on the served base passes check in adapter mode, under release.yaml's model name;
    the whole-model build checks (engine, precision, memory) are the base's and are not asked of it."""
    base_version(project_dir, folder_base_digest(tiny_run.checkpoint_dir))
    (project_dir / "release.yaml").write_text(f"model: {BASE}-support\n{ADAPTER_MODE}")
    run_id = load_train_module().log_run(tiny_run, project_dir, experiment="support")
    checked = relctl(project_dir, "check", run_id, "--json")
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.stdout)
    assert report["found"]["base"] is True and report["model"] == f"{BASE}-support"
    assert report["needs"] is None  # no whole-model memory plan: nothing is built beside the base


def test_release_yaml_adapter_mode_bad_input_is_one_line(project_dir: Path) -> None:
    """Each mistake is exit 2 with one error line naming the key and one hint line, before any registry call
    (the run id below names no run: a registry call would say so instead)."""
    run_id = "0" * 32
    cases = {
        "release:\n  mode: adapter\n": "release: mode adapter needs onto",
        "release:\n  mode: adapter\n  onto: tiny-llm\n": "release.onto: 'tiny-llm' names no base version",
        "release:\n  mode: adapter\n  onto: 'tiny llm@production'\n": "release.onto: model name 'tiny llm'",
        "release:\n  onto: tiny-llm@production\n": "release: onto is for mode: adapter",
        "release:\n  mode: adaptor\n": "release.mode: Input should be 'merged' or 'adapter'",
        f"model: {BASE}\n{ADAPTER_MODE}": f"model '{BASE}' is the base that release.onto names",
    }
    for text, expected in cases.items():
        (project_dir / "release.yaml").write_text(text)
        for command in (["promote", run_id], ["check", run_id]):
            result = relctl(project_dir, *command)
            lines = result.stderr.splitlines()
            assert result.exit_code == 2, (text, command, result.output)
            assert lines[0].startswith("error: release.yaml: ") and expected in lines[0], (text, lines)
            assert len(lines) == 2 and lines[1].startswith("hint: "), (text, lines)
    (project_dir / "release.yaml").write_text(ADAPTER_MODE)
    disagrees = relctl(project_dir, "promote", run_id, "--onto", f"{BASE}/3")
    assert disagrees.exit_code == 2
    assert f"--onto {BASE}/3 disagrees with release.yaml's release.onto {BASE}@production" in disagrees.stderr
    named_as_base = relctl(project_dir, "promote", run_id, "--model", BASE)
    assert named_as_base.exit_code == 2 and "an adapter is its own registered model" in named_as_base.stderr
    assert not (project_dir / ".relctl").exists()  # found before the registry was opened: nothing written


def test_what_an_adapter_release_would_skip_is_refused(tiny_run: Any, project_dir: Path) -> None:
    """Gates other than the canary, require_approval with a canary, a required gate not configured, engines: an adapter
    release does not carry them out, so each is exit 2 (one line each, from promote and from check) before
    anything is written, never skipped in silence."""
    served = folder_base_digest(tiny_run.checkpoint_dir)
    base_version(project_dir, served)
    run_id = load_train_module().log_run(tiny_run, project_dir, experiment="support")
    cases = {
        "gates:\n  eval: {}\n  safety: {}\n": "gates.eval, gates.safety: not run by an adapter release",
        "require_approval: true\ngates:\n  canary: {}\n": "require_approval with gates.canary: an adapter's canary",
        "require: [canary]\n": "release.yaml: require lists canary, which gates: does not configure",
        "engines:\n  - {backend: vllm, precision: fp32}\n": "engines: an adapter serves on its base's engine",
    }
    for extra, expected in cases.items():
        (project_dir / "release.yaml").write_text(f"model: {BASE}-support\n{ADAPTER_MODE}{extra}")
        promoted = relctl(project_dir, "promote", run_id)
        assert promoted.exit_code == 2, (extra, promoted.output)
        lines = promoted.stderr.splitlines()
        assert lines[0] == f"error: {expected}" or (lines[0].startswith("error: ") and expected in lines[0]), lines
        assert len(lines) == 2 and lines[1].startswith("hint: "), lines
        checked = relctl(project_dir, "check", run_id, "--json")
        assert checked.exit_code == 2, (extra, checked.output)
        found = [p["error"] for p in json.loads(checked.stdout)["problems"]]
        assert len([p for p in found if expected in p]) == 1, found
        # --onto on the command line with a merged-mode release.yaml takes the same path
        (project_dir / "release.yaml").write_text(f"model: {BASE}\n{extra}")
        onto = relctl(project_dir, "promote", run_id, "--onto", f"{BASE}@production", "--model", f"{BASE}-support")
        assert onto.exit_code == 2 and expected in onto.stderr, (extra, onto.output)
    # A required canary on the adapter's first release (no production to judge against) is refused too.
    (project_dir / "release.yaml").write_text(f"model: {BASE}-support\n{ADAPTER_MODE}require: [canary]\n"
                                              "gates:\n  canary: {}\n")
    first = relctl(project_dir, "promote", run_id)
    assert first.exit_code == 2, first.output
    assert f"require: canary, but {BASE}-support has no production version" in first.stderr
    registry = Registry(resolve_store(project_dir))
    assert not registry.model_exists(f"{BASE}-support")


def test_adapter_validation_prompts_resolve_from_release_yaml(tiny_run: Any, project_dir: Path) -> None:
    """validation.prompts in adapter mode is read from release.yaml's folder (as a merged release's is), and a
    missing file is exit 2 before the run's checkpoint is downloaded; nothing is registered."""
    base_version(project_dir, folder_base_digest(tiny_run.checkpoint_dir))
    (project_dir / "release.yaml").write_text(
        f"model: {BASE}-support\n{ADAPTER_MODE}validation:\n  prompts: eval/missing.jsonl\n")
    run_id = load_train_module().log_run(tiny_run, project_dir, experiment="support")
    result = relctl(project_dir, "promote", run_id)
    assert result.exit_code == 2, result.output
    assert f"validation.prompts: {project_dir / 'eval' / 'missing.jsonl'} is not a file" in result.stderr
    assert "intake" not in result.stderr  # refused before the download
    assert not Registry(resolve_store(project_dir)).model_exists(f"{BASE}-support")


def rendered(project: Path, spec: str, *flags: str) -> dict[str, Any]:
    """`relctl render kserve SPEC` as JSON (a CPU vLLM package: its engine image named)."""
    result = relctl(project, "render", "kserve", spec, *flags, "--format", "json", "--image", "example.com/relctl:1",
                    "--engine-image", "example.com/vllm-cpu:1")
    assert result.exit_code == 0, result.output
    manifest: dict[str, Any] = json.loads(result.stdout)
    return manifest


def test_render_kserve_pins_each_adapter_by_digest(story: dict[str, Any], tmp_path: Path) -> None:
    """`render kserve BASE/VERSION --adapters`: every production adapter of the served base, pinned by its
    package content digest as the registry records it, fetched by a verifying pull that insists on that digest,
    and loaded by vLLM with the runner's flags. The pull command the manifest writes is run here as the pod's
    init container would run it: the pinned digest passes, any other is refused."""
    project = story["project"]
    registry = Registry(resolve_store(project))
    base = registry.version_for(BASE, "production")
    assert base is not None
    wanted = {name: mv for name in registry.list_models()
              if (mv := registry.version_for(name, "production")) is not None
              and mv.tags.get(T.KIND) == "adapter" and mv.tags.get(T.BASE_VERSION) == base.version}
    assert len(wanted) >= 2, wanted
    manifest = rendered(project, f"{BASE}/{base.version}", "--adapters")
    pins = {p["model"]: p for p in json.loads(manifest["metadata"]["annotations"]["relctl/adapters"])}
    assert set(pins) == set(wanted)
    for name, mv in wanted.items():
        assert pins[name]["version"] == mv.version
        assert pins[name]["sha256"] == mv.tags[T.CONTENT_SHA256]
        assert pins[name]["manifest_sha256"] == mv.tags[T.MANIFEST_SHA256]
    predictor = manifest["spec"]["predictor"]
    pulls = {c["command"][c["command"].index("--model") + 1]: c["command"] for c in predictor["initContainers"]
             if c["name"].startswith("relctl-pull-adapter-")}
    assert set(pulls) == set(wanted)
    for name, command in pulls.items():
        assert command[command.index("--sha256") + 1] == wanted[name].tags[T.CONTENT_SHA256]
    args = predictor["containers"][0]["args"]
    assert "--enable-lora" in args
    modules = args[args.index("--lora-modules") + 1:]
    assert sorted(modules) == sorted(f"{n}=/mnt/models/adapters/{n}/model" for n in wanted)
    # An adapter's own MODEL/VERSION renders its base with that adapter alone.
    one = next(iter(wanted))
    alone = rendered(project, f"{one}/{wanted[one].version}")
    assert alone["metadata"]["annotations"]["relctl/version"] == base.version
    assert [p["model"] for p in json.loads(alone["metadata"]["annotations"]["relctl/adapters"])] == [one]
    # The init container's pull, against the story's registry: the pinned digest verifies, another is refused.
    command = pulls[one]
    pull = command[command.index("pull") + 1:]
    pull[pull.index("--to") + 1] = str(tmp_path / "pulled")
    ok = relctl(project, "pull", *pull)
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "pulled" / "model" / "adapter_model.safetensors").is_file()
    other = wanted[next(n for n in wanted if n != one)].tags[T.CONTENT_SHA256]
    pull[pull.index("--sha256") + 1] = other
    pull[pull.index("--to") + 1] = str(tmp_path / "refused")
    refused = relctl(project, "pull", *pull)
    assert refused.exit_code == 2 and other in refused.stderr, refused.output
    assert not (tmp_path / "refused").exists()

