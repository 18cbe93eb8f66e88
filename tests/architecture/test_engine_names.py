"""No engine is known outside its backend package: every installed backend's id (and the module name it takes
in a Python path) and its own runtime file names, read from the `relctl.backends` entry points, must not
appear in relctl's code outside release/backends/ (release/ and gates/, comments and strings included: a
name in a docstring is where a branch on it starts). A new engine then needs its package and one entry point,
and nothing else changes. The allow-list holds at most two lines, each saying why."""

from __future__ import annotations

import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from release.backends import ENTRY_POINT_GROUP
from release.backends.base import Backend

ROOT = Path(__file__).resolve().parents[2]
# The files of a Hugging Face checkpoint, which every stage reads whatever the engine: not an engine's own.
CHECKPOINT_FILES = frozenset({"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors",
                              "generation_config.json", "special_tokens_map.json"})
# (path, the line's text stripped) -> why it may name an engine. At most two.
ALLOWED = {
    ("release/core/package.py", 'LEGACY_BACKEND = "onnxruntime-genai"'):
        "format-1 packages predate the manifest's backend entry; they were all built by this one engine",
}


def installed_backends() -> dict[str, type[Backend]]:
    """Every backend the entry points name (built-ins and plug-ins alike), by id."""
    found: dict[str, type[Backend]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        cls = ep.load()
        assert isinstance(cls, type) and issubclass(cls, Backend), ep.value
        found[ep.name] = cls
    return found


def engine_words() -> dict[str, str]:
    """word -> the backend it belongs to: the id, its module-name form, and its own runtime file names."""
    words: dict[str, str] = {}
    for backend_id, cls in installed_backends().items():
        for word in (backend_id, backend_id.replace("-", "_"), *cls.runtime_files):
            if word not in CHECKPOINT_FILES:
                words[word] = backend_id
    return words


def pattern(words: dict[str, str]) -> re.Pattern[str]:
    # A word on its own (not inside another identifier), case-insensitive: "vLLM" and "VLLM_VERSION" count.
    alternatives = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    return re.compile(rf"(?<![A-Za-z0-9])({alternatives})(?![a-z0-9])", re.IGNORECASE)


def mentions(files: list[Path], words: dict[str, str]) -> list[str]:
    found = []
    rx = pattern(words)
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            hit = rx.search(line)
            if hit and (rel, line.strip()) not in ALLOWED:
                found.append(f"{rel}:{number}: {hit.group(1)} ({line.strip()[:100]})")
    return found


def code_outside_backends() -> list[Path]:
    files = [*sorted((ROOT / "release").rglob("*.py")), *sorted((ROOT / "gates").rglob("*.py"))]
    return [p for p in files if not p.relative_to(ROOT).as_posix().startswith("release/backends/")]


def test_the_entry_points_name_the_engines_this_test_looks_for() -> None:
    words = engine_words()
    assert {"onnxruntime-genai", "vllm"} <= set(installed_backends())
    assert "genai_config.json" in words and "model.onnx" in words   # the engines' own files, not config.json


def test_no_engine_is_named_outside_its_backend() -> None:
    assert len(ALLOWED) <= 2
    assert mentions(code_outside_backends(), engine_words()) == []


def test_every_allowed_line_still_exists() -> None:
    """An allow-list entry whose line is gone is stale: the list shrinks with the code."""
    for rel, line in ALLOWED:
        assert line in [text.strip() for text in (ROOT / rel).read_text().splitlines()], rel


def test_no_branch_on_an_engine_id_anywhere_outside_backends() -> None:
    ids = "|".join(re.escape(i) for i in installed_backends())
    branch = re.compile(r"""[!=]=\s*["'](""" + ids + r""")["']""")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in code_outside_backends()
                 for n, line in enumerate(p.read_text().splitlines(), 1) if branch.search(line)]
    assert offenders == []


@pytest.mark.parametrize("planted", ['if facts.backend == "vllm":', "# served by vLLM's engine",
                                     'path = model_dir / "genai_config.json"',
                                     "from release.backends.onnxruntime_genai import model"])
def test_the_checker_finds_a_planted_mention(tmp_path: Path, planted: str) -> None:
    """The rule can fail: a module that names an engine is reported with its line."""
    path = ROOT / "release" / "_planted_engine_name.py"
    path.write_text(f"def f() -> None:\n    {planted}\n")
    try:
        assert [m.split(": ")[0] for m in mentions([path], engine_words())] == ["release/_planted_engine_name.py:2"]
    finally:
        path.unlink()
