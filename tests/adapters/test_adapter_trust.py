"""Trust from the signed package, not tags (release/adapters/trust.py; docs/adapters.md "Trust"): every reader
that serves or pins an adapter follows the base its signed manifest names, whatever the registry's tags say,
and the release-state rules decide what may be served. Plus `render kserve --adapters` for a base that relctl
serve runs, and `relctl serve ADAPTER`.

Cheap and engine-free: real signed packages of the real layout (an onnxruntime-genai base folder, an adapter
folder), registered with `relctl register` into MLflow on SQLite, the adapter's tags set as an adapter release
writes them. Every refusal here happens before an engine would load. The module's registry:

  tiny-llm v1 (production) and v2: two bases (other bytes, other base-weights digests)
  tiny-llm-support v1 (production): an adapter whose signed manifest binds it to tiny-llm v1 (its tags and
  release state changed by a test are put back by that test)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from release.adapters.package import AdapterPackaging
from release.adapters.trust import BaseIdentity
from release.backends import get_backend
from release.canary.adapter_mode import check_versions_bound
from release.core.errors import InputError
from release.core.package import build_package
from release.registry import Registry
from release.registry import tags as T
from release.registry.store import resolve_store
from release.serving.adapter_setup import registry_fetch
from release.serving.api import base_adapters
from release.serving.source import resolve_package
from release.signing.keys import project_trust
from tests.deploy.conftest import GIB, Project, genai_package, register
from tests.deploy.test_kserve import schema_problems

BASE, ADAPTER = "tiny-llm", "tiny-llm-support"
DIGEST = {"1": "sha256:" + "1" * 64, "2": "sha256:" + "2" * 64}
IMAGE = "example.com/relctl:1"


@dataclass(frozen=True)
class Story:
    project: Project
    registry: Registry
    root: Path

    def base(self, version: str) -> BaseIdentity:
        package = resolve_package(f"{BASE}/{version}", self.project.root)
        return BaseIdentity.of_package(package.manifest, BASE, version)


def adapter_package(root: Path, base: dict[str, str]) -> Path:
    """An adapter package as an adapter release builds it: the PEFT files under model/, `kind: adapter` and
    the base it was validated on in its manifest."""
    files = root / "adapter-rt"
    files.mkdir()
    (files / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                           "target_modules": ["q_proj"]}))
    save_file({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((4, 64), np.float32),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros((64, 4), np.float32)},
              str(files / "adapter_model.safetensors"))
    fields = {"model_name": ADAPTER, "precision": "int4", "lineage": {}, "kind": "adapter", "serving": {},
              "base": base}
    build_package(root / "adapter", files, files, fields,
                  AdapterPackaging(get_backend("onnxruntime-genai"), base["package_content_sha256"]))
    return root / "adapter"


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory, release_keypair: tuple[Path, Path]) -> Story:
    root = tmp_path_factory.mktemp("adapter-trust")
    project = Project(root / "project", release_keypair[1], release_keypair[0])
    project.root.mkdir()
    for version in ("1", "2"):
        lineage = {"checkpoint": {"base_sha256": DIGEST[version]}}
        package = genai_package(root, f"base-v{version}", "cpu", BASE, lineage)
        assert register(project, package, BASE, 3 * GIB) == version
    registry = Registry(resolve_store(project.root))
    v1 = registry.get_version(BASE, "1")
    bound = {"model": BASE, "version": "1", "sha256": DIGEST["1"], "package_content_sha256": v1.tags[T.CONTENT_SHA256]}
    done = project.relctl("register", str(adapter_package(root, bound)), "--model", ADAPTER, "--production", "--json")
    assert done.exit_code == 0 and str(json.loads(done.stdout)["version"]) == "1", done.output
    for tag, value in {T.KIND: "adapter", T.BASE_MODEL: BASE, T.BASE_VERSION: "1", T.BASE_SHA256: DIGEST["1"]}.items():
        registry.set_version_tag(ADAPTER, "1", tag, value)   # as an adapter release tags its version
    return Story(project, registry, root)


@pytest.fixture()
def retagged(story: Story) -> Iterator[Story]:
    """Adapter v1's tags rewritten to say it was built for tiny-llm v2 (and v2's digest), as anyone with
    registry write access could; put back afterwards."""
    said = {T.BASE_VERSION: "2", T.BASE_SHA256: DIGEST["2"]}
    for tag, value in said.items():
        story.registry.set_version_tag(ADAPTER, "1", tag, value)
    try:
        yield story
    finally:
        for tag, value in {T.BASE_VERSION: "1", T.BASE_SHA256: DIGEST["1"]}.items():
            story.registry.set_version_tag(ADAPTER, "1", tag, value)


def test_serve_follows_the_signed_base_not_the_tags(retagged: Story) -> None:
    """The defect: `relctl serve tiny-llm/2 --adapters` served an adapter validated on v1 once its tags said v2.
    Now the server starts with no such adapter: refused (exit 2) naming the signed base and the served one."""
    story = retagged
    refusal = (rf"{ADAPTER} v1 is bound by its signed package to {BASE} v1 .* not to the base it would serve on, "
               rf"{BASE} v2 .*they differ in: version, base weights, base package")
    with pytest.raises(InputError, match=refusal):
        base_adapters(resolve_package(f"{BASE}/2", story.project.root), story.project.root)
    served = story.project.relctl("serve", f"{BASE}/2", "--adapters", "--port", "0")
    assert served.exit_code == 2 and f"bound by its signed package to {BASE} v1" in served.stderr, served.output
    # On the base it is bound to it still serves (the tags no longer find it there: named by hand, as a switch).
    setup = base_adapters(resolve_package(f"{BASE}/1", story.project.root), story.project.root)
    assert setup.served == [] and setup.fetch(ADAPTER, "1", False)[0] == "1"


def test_verify_names_the_signed_base_and_a_tag_that_disagrees(story: Story) -> None:
    ok = story.project.relctl("verify", f"{ADAPTER}/1", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["adapter_of"] == {"model": BASE, "version": "1", "sha256": DIGEST["1"],
                                                    "package_content_sha256": story.base("1").content_sha256}
    text = story.project.relctl("verify", f"{ADAPTER}/1")
    assert f"an adapter bound by its signed package to {BASE} v1" in text.stdout, text.output
    story.registry.set_version_tag(ADAPTER, "1", T.BASE_VERSION, "2")
    try:
        changed = story.project.relctl("verify", f"{ADAPTER}/1")
    finally:
        story.registry.set_version_tag(ADAPTER, "1", T.BASE_VERSION, "1")
    lines = changed.stderr.splitlines()
    assert changed.exit_code == 2 and len(lines) == 2, changed.output
    assert f"binds it to {BASE} v1" in lines[0] and "relctl.base_version='2' (signed: '1')" in lines[0], lines
    assert "changed after release" in lines[0] and lines[1].startswith("hint: ")


def test_admin_switch_and_canary_arms_check_the_signed_base(story: Story) -> None:
    """The admin switch's fetch (the one every run-time load goes through) and the canary's arms refuse a
    version bound to another base than the server's, with the same message; on its own base both accept it."""
    trust = project_trust(story.project.root)
    cache = story.root / "cache"
    on_v2 = registry_fetch(story.registry, story.base("2"), cache, trust, print)
    with pytest.raises(InputError, match=rf"bound by its signed package to {BASE} v1"):
        on_v2(ADAPTER, "1", False)
    assert registry_fetch(story.registry, story.base("1"), cache, trust, print)(ADAPTER, None, False)[0] == "1"
    adapter = story.registry.get_version(ADAPTER, "1")
    with pytest.raises(InputError, match=rf"bound by its signed package to {BASE} v1 .*{BASE} v2"):
        check_versions_bound(story.registry, trust, [adapter], story.base("2"))
    check_versions_bound(story.registry, trust, [adapter], story.base("1"))


@pytest.mark.parametrize(("state", "candidate", "switch", "pin"), [
    ("rejected", False, "production may not point at v1: it is rejected", "candidate may not point at v1"),
    ("stopped", False, "it is stopped", None),
    ("registering", False, "it is registering", "candidate may not point at v1: it is registering"),
    ("registering", True, "it is registering", None),   # its own release's canary pins it
    ("awaiting-approval", False, "waits for an approval", None),
    ("released", False, None, None),
])
def test_a_version_is_served_as_its_release_state_allows(story: Story, state: str, candidate: bool,
                                                         switch: str | None, pin: str | None) -> None:
    """An admin switch (the adapter's own name) follows the production rule of registry/states.py, a pin
    (MODEL:VERSION, a canary's candidate arm) the candidate rule: a rejected version is never served."""
    fetch = registry_fetch(story.registry, story.base("1"), story.root / "cache", project_trust(story.project.root),
                           print)
    before = story.registry.get_version(ADAPTER, "1").tags[T.RELEASE_STATE]
    if candidate:  # nominated as its release would (before the state: a move checks the state it finds)
        story.registry.move_aliases(ADAPTER, {"candidate": "1"}, "test", "nominated", None)
    story.registry.set_version_tag(ADAPTER, "1", T.RELEASE_STATE, state)
    try:
        for pinned, refusal in ((False, switch), (True, pin)):
            if refusal is None:
                assert fetch(ADAPTER, "1", pinned)[0] == "1"
            else:
                with pytest.raises(InputError, match=f"{ADAPTER} v1 is not served: .*{refusal}"):
                    fetch(ADAPTER, "1", pinned)
    finally:
        story.registry.set_version_tag(ADAPTER, "1", T.RELEASE_STATE, before)
        if candidate:
            story.registry.move_aliases(ADAPTER, {"candidate": None}, "test", "cleared", None)


def test_serving_an_adapter_as_a_model_names_its_base(story: Story) -> None:
    result = story.project.relctl("serve", f"{ADAPTER}@production", "--port", "0")
    lines = result.stderr.splitlines()
    assert result.exit_code == 2 and len(lines) == 2, result.output
    assert lines[0] == (f"error: {ADAPTER}@production is a LoRA adapter ({ADAPTER}:1), not a whole model: it serves "
                        f"beside its base {BASE}")
    assert lines[1] == f"hint: relctl serve {BASE}@production --adapters"


def rendered(story: Story, spec: str) -> dict[str, Any]:
    result = story.project.relctl("render", "kserve", spec, "--adapters", "--image", IMAGE, "--format", "json")
    assert result.exit_code == 0, result.output
    manifest: dict[str, Any] = json.loads(result.stdout)
    return manifest


def test_render_kserve_adapters_for_a_base_relctl_serve_runs(story: Story, tmp_path: Path) -> None:
    """An onnxruntime-genai base with its adapters: a valid InferenceService whose init containers pull each
    adapter pinned by its package digest, and whose relctl serve starts with those folders; the pull and the
    server's own check of the pulled folder run here as the pod would run them."""
    manifest = rendered(story, f"{BASE}/1")
    assert schema_problems(manifest, tmp_path) == []
    predictor = manifest["spec"]["predictor"]
    pulls = [c for c in predictor["initContainers"] if c["name"].startswith("relctl-pull-adapter-")]
    content = story.registry.get_version(ADAPTER, "1").tags[T.CONTENT_SHA256]
    folder = f"/var/cache/relctl/adapters/{ADAPTER}"
    assert [c["command"] for c in pulls] == [["relctl", "--project-dir", "/var/cache/relctl", "pull", f"{ADAPTER}/1",
                                              "--to", folder, "--model", ADAPTER, "--sha256", content]]
    assert pulls[0]["image"] == IMAGE
    assert {m["name"] for m in pulls[0]["volumeMounts"]} >= {"relctl-cache", "relctl-trusted-keys"}
    container = predictor["containers"][0]
    assert container["args"] == [f"{BASE}/1", "--adapter-package", f"{ADAPTER}/1={folder}"]
    pins = json.loads(manifest["metadata"]["annotations"]["relctl/adapters"])
    assert [(p["model"], p["version"], p["sha256"]) for p in pins] == [(ADAPTER, "1", content)]
    # The init container's pull, then the server's start on what it pulled (verified, bound to the base).
    command = pulls[0]["command"]
    pull = command[command.index("pull") + 1:]
    pull[pull.index("--to") + 1] = str(tmp_path / "pulled")
    assert story.project.relctl("pull", *pull).exit_code == 0
    base = resolve_package(f"{BASE}/1", story.project.root)
    setup = base_adapters(base, story.project.root, [f"{ADAPTER}/1={tmp_path / 'pulled'}"])
    assert [(a.model, a.version, a.folder) for a in setup.served] == [(ADAPTER, "1", tmp_path / "pulled" / "model")]
    on_v2 = resolve_package(f"{BASE}/2", story.project.root)
    with pytest.raises(InputError, match=rf"bound by its signed package to {BASE} v1"):
        base_adapters(on_v2, story.project.root, [f"{ADAPTER}/1={tmp_path / 'pulled'}"])


def test_render_kserve_refuses_an_adapter_retagged_onto_another_base(retagged: Story) -> None:
    result = retagged.project.relctl("render", "kserve", f"{BASE}/2", "--adapters", "--image", IMAGE)
    assert result.exit_code == 2 and f"{ADAPTER} v1 is bound by its signed package to {BASE} v1" in result.stderr, \
        result.output
    assert not result.stdout
