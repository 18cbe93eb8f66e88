"""Every JSON/YAML reader of relctl goes through the one bounded loader (release/core/jsonfile.py): for each
reader below, a bad file — garbage, the wrong type, a duplicated key, nesting too deep, too large — is an
InputError (exit 2) whose message is one line naming the file, raised by the real reader (a backend's
folder facts, a load-generator dataset or segment summary, the router's records, a trace log, a checkpoint
index, release.yaml as `relctl init` and `relctl plan` read it, tokenizer.json before the tokenizers library
parses it)."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from release.backends.folder_facts import model_facts
from release.backends.onnxruntime_genai.folder import built_for
from release.backends.onnxruntime_genai.runner import read_chat_template
from release.canary.traffic import load_rows
from release.commands.init import _configured_backend
from release.commands.trace import target_from_log
from release.core.checkpoint import read_header, weight_files
from release.core.errors import InputError
from release.core.tokenizer_file import load_tokenizer
from release.memory.cli import _default_engine
from release.serving.loadgen.dataset import load_dataset
from release.serving.loadgen.segments import read_segment
from release.serving.router.records import read_records
from release.stages.validate import load_prompts

DEEP = "[" * 200 + "]" * 200
JSON = {"garbage": "{not json", "wrong-type": "[1, 2]", "duplicate-key": '{"a": 1, "a": 2}', "too-deep": DEEP}
JSONL = {"garbage": "{not json\n", "wrong-type": "[1, 2]\n", "duplicate-key": '{"prompt": "a", "prompt": "b"}\n',
         "too-deep": DEEP + "\n"}
YAML = {"garbage": "convert: [unclosed\n", "duplicate-key": "convert: {}\nconvert: {}\n",
        "too-deep": "a: " + "[" * 200 + "]" * 200 + "\n"}
# Readers that take a field of the right name but the wrong type.
FIELDS = {"tokenizer_config.json": '{"chat_template": 5}', "generation_config.json": '{"eos_token_id": "x"}',
          "model.safetensors.index.json": '{"weight_map": "x"}'}


def _in_folder(name: str, read: Callable[[Path], object]) -> Callable[[Path, str], Callable[[], object]]:
    """A reader of the file `name` in a model folder (config.json beside it when the file is another one)."""
    def setup(tmp: Path, text: str) -> Callable[[], object]:
        folder = tmp / "model"
        folder.mkdir()
        if name != "config.json":
            (folder / "config.json").write_text('{"model_type": "llama"}')
        (folder / name).write_text(text)
        return lambda: read(folder)
    return setup


def _file(name: str, read: Callable[[Path], object]) -> Callable[[Path, str], Callable[[], object]]:
    def setup(tmp: Path, text: str) -> Callable[[], object]:
        (tmp / name).write_text(text)
        return lambda: read(tmp / name)
    return setup


def _plan_release_yaml(tmp: Path, text: str) -> Callable[[], object]:
    (tmp / "release.yaml").write_text(text)
    (tmp / "config.json").write_text('{"model_type": "llama"}')

    def read() -> object:
        cwd = Path.cwd()
        os.chdir(tmp)
        try:
            with click.Context(click.Command("plan")):
                return _default_engine(Path("config.json"))
        finally:
            os.chdir(cwd)
    return read


def _init_release_yaml(tmp: Path, text: str) -> Callable[[], object]:
    (tmp / "release.yaml").write_text(text)
    return lambda: _configured_backend(tmp)


def _safetensors_header(tmp: Path, text: str) -> Callable[[], object]:
    header = text.encode()
    (tmp / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return lambda: read_header(tmp / "model.safetensors")


def _trace_log(tmp: Path, text: str) -> Callable[[], object]:
    (tmp / "requests-1.jsonl").write_text(text)
    return lambda: target_from_log(tmp, "resp-1")


SITES: dict[str, tuple[str, Callable[[Path, str], Callable[[], object]], dict[str, str]]] = {
    "genai_config": ("genai_config.json", _in_folder("genai_config.json", built_for), JSON),
    "tokenizer_config": ("tokenizer_config.json", _in_folder("tokenizer_config.json", read_chat_template), JSON),
    "config": ("config.json", _in_folder("config.json", model_facts), JSON),
    "generation_config": ("generation_config.json", _in_folder("generation_config.json", model_facts), JSON),
    "checkpoint-index": ("model.safetensors.index.json",
                         _in_folder("model.safetensors.index.json", weight_files), JSON),
    "loadgen-dataset": ("data.jsonl", _file("data.jsonl", lambda p: load_dataset(p, 16)), JSONL),
    "canary-traffic": ("data.jsonl", _file("data.jsonl", lambda p: load_rows(p, 16)), JSONL),
    "router-records": ("records.jsonl", _file("records.jsonl", read_records), JSONL),
    "validate-prompts": ("prompts.jsonl", _file("prompts.jsonl", load_prompts), JSONL),
    "trace-log": ("requests-1.jsonl", _trace_log, {k: v for k, v in JSONL.items() if k != "wrong-type"}),
    "bench-segment-summary": ("summary.json", _file("summary.json", lambda p: read_segment(p.parent)), JSON),
    "safetensors-header": ("model.safetensors", _safetensors_header, JSON),
    "init-release.yaml": ("release.yaml", _init_release_yaml, YAML),
    "plan-release.yaml": ("release.yaml", _plan_release_yaml, YAML),
}
CASES = [(site, defect) for site, (_, _, texts) in SITES.items() for defect in [*texts, "field"]
         if defect != "field" or SITES[site][0] in FIELDS]


@pytest.mark.parametrize(("site", "defect"), CASES, ids=[f"{s}-{d}" for s, d in CASES])
def test_a_bad_file_is_exit_2_in_one_line_naming_it(tmp_path: Path, site: str, defect: str) -> None:
    name, setup, texts = SITES[site]
    read = setup(tmp_path, FIELDS[name] if defect == "field" else texts[defect])
    with pytest.raises(InputError) as raised:
        read()
    message = str(raised.value)
    assert raised.value.exit_code == 2
    assert "\n" not in message and name in message, message


def test_a_tokenizer_json_past_its_bound_is_refused_before_the_library_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "ckpt" / "tokenizer.json"
    path.parent.mkdir()
    with path.open("wb") as fh:   # sparse: 129 MiB on paper, nothing on disk
        fh.truncate(129 * 1024 * 1024)
    with pytest.raises(InputError) as raised:
        load_tokenizer(path)
    assert "ckpt/tokenizer.json" in str(raised.value) and "at most 134217728 are read" in str(raised.value)
    path.write_bytes(json.dumps({"version": "1.0"}).encode() + b"\xff")
    with pytest.raises(InputError, match=r"tokenizer\.json: not UTF-8"):
        load_tokenizer(path)
