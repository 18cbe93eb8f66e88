"""Shared fixtures: one tiny, really trained Llama checkpoint per test session.

The checkpoint comes from examples/tiny-llm/tinyllm.py (task: reverse 4 letters, e.g.
"reverse b d a f ->" answers "f a d b"; harmful requests answer "I can't help with that.").
Session fixtures are built once under pytest's tmp dir and shared: copy a folder before changing it.

- tiny_checkpoint: HF layout folder: config.json, generation_config.json, model.safetensors (fp32 base),
  tokenizer.json + tokenizer_config.json + special_tokens_map.json (BOS prepended), and a LoRA adapter
  (adapter_config.json + adapter_model.safetensors, r=8, alpha=16, all 7 Llama projections).
- tiny_base_only: the same base and tokenizer without the adapter files.
- tiny_data: folder with validation/prompts.jsonl ({"prompt"}) and eval.jsonl ({"prompt", "expected"},
  held-out task rows + held-out safety rows); compare generated text to "expected" after .strip().
- tiny_run: the TrainResult (losses, untrained/base/final exact match) behind the three above.
- tiny_unsafe_checkpoint / tiny_unsafe_data: same recipe trained WITHOUT the safety slice (built lazily,
  only by tests that ask for it): the candidate a safety gate must reject.
- tinyllm: the examples/tiny-llm/tinyllm.py module (greedy_generate, exact_match, make_safety, ...).
- project_dir: a fresh folder per test; its embedded MLflow store is project_dir/.relctl.
- release_keys (autouse, through the environment): signing is on by default, so every test project signs
  with one session key pair, as CI does: RELCTL_SIGNING_KEY names the private key (0600) and
  RELCTL_TRUSTED_KEYS its public half. A test about signing itself unsets them (tests/signing).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TINYLLM_PATH = REPO_ROOT / "examples" / "tiny-llm" / "tinyllm.py"


def load_tinyllm() -> ModuleType:
    """Import examples/tiny-llm/tinyllm.py by path (its folder name is not a valid package name)."""
    name = "tinyllm"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TINYLLM_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before exec so dataclasses defined in the module can resolve their own module.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_train_module() -> ModuleType:
    """Import examples/tiny-llm/train.py by path: its log_run() logs a trained run the way the example does."""
    spec = importlib.util.spec_from_file_location("tiny_llm_train", TINYLLM_PATH.with_name("train.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tinyllm() -> ModuleType:
    return load_tinyllm()


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, tinyllm: ModuleType) -> Any:
    out = tmp_path_factory.mktemp("tiny-llm")
    return tinyllm.train_tiny_llm(out, tinyllm.TrainConfig())


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_run: Any) -> Path:
    path: Path = tiny_run.checkpoint_dir
    return path


@pytest.fixture(scope="session")
def tiny_data(tiny_run: Any) -> Path:
    path: Path = tiny_run.data_dir
    return path


@pytest.fixture(scope="session")
def tiny_base_only(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    dest = tmp_path_factory.mktemp("tiny-llm-base") / "checkpoint"
    shutil.copytree(
        tiny_checkpoint, dest, ignore=shutil.ignore_patterns("adapter_config.json", "adapter_model.safetensors")
    )
    return dest


@pytest.fixture(scope="session")
def tiny_unsafe_run(tmp_path_factory: pytest.TempPathFactory, tinyllm: ModuleType) -> Any:
    out = tmp_path_factory.mktemp("tiny-llm-unsafe")
    return tinyllm.train_tiny_llm(out, tinyllm.TrainConfig(safety=False))


@pytest.fixture(scope="session")
def tiny_unsafe_checkpoint(tiny_unsafe_run: Any) -> Path:
    path: Path = tiny_unsafe_run.checkpoint_dir
    return path


@pytest.fixture(scope="session")
def tiny_unsafe_data(tiny_unsafe_run: Any) -> Path:
    path: Path = tiny_unsafe_run.data_dir
    return path


@pytest.fixture(scope="session")
def release_keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(private key, public key): the session's release key pair, as `relctl keygen` writes one."""
    from release.signing.keygen import create_keypair

    pair = create_keypair(tmp_path_factory.mktemp("release-keys"))
    return pair.private, pair.public


@pytest.fixture(scope="session", autouse=True)
def release_keys(release_keypair: tuple[Path, Path]) -> Iterator[tuple[Path, Path]]:
    """Every test project is signed and verified (signing is on unless release.yaml says `signing: off`).
    Session-wide, so module fixtures that promote or register (before any function fixture) sign too; a test
    that changes the variables with monkeypatch gets them back afterwards."""
    from release.signing.keys import KEY_ENV, TRUSTED_ENV

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, str(release_keypair[0]))
        mp.setenv(TRUSTED_ENV, str(release_keypair[1]))
        yield release_keypair


@pytest.fixture()
def project_dir(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


# -- make test-fast: the unit and contract tests, no engine start ---------------------------------------------
# A module is an engine module when it is marked slow or listed in tests/engine_modules.txt: the modules in
# which a measured `make test` spent more than ENGINE_SECONDS on one test (a module fixture that builds or
# starts an engine charges its first test, so the whole module goes). `make test-fast` deselects the marker;
# `make test` runs everything. Regenerate the list from a run recorded with RELCTL_TEST_DURATIONS=FILE:
# `python -m tests.durations FILE > tests/engine_modules.txt`.
ENGINE_MODULES = Path(__file__).with_name("engine_modules.txt")


def engine_modules() -> set[str]:
    lines = ENGINE_MODULES.read_text().splitlines() if ENGINE_MODULES.is_file() else []
    return {line.split("#")[0].strip() for line in lines} - {""}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    listed = engine_modules()
    for item in items:
        if item.get_closest_marker("slow") or item.nodeid.split("::")[0] in listed:
            item.add_marker(pytest.mark.engine)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With RELCTL_TEST_DURATIONS=FILE, each phase's seconds are appended there as the run goes (tab separated:
    node id, phase, seconds): the record tests/durations.py reads."""
    import os

    path = os.environ.get("RELCTL_TEST_DURATIONS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{report.nodeid}\t{report.when}\t{report.duration:.2f}\n")
