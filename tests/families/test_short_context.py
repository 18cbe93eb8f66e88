"""A Gemma-2 whose context is shorter than its sliding window releases; a candidate that cannot run is a
build/engine failure (exit 4, the engine's message), never a validation verdict.

transformers' Gemma2Config keeps sliding_window 4096 whatever max_position_embeddings is. Built as it is,
onnxruntime-genai sizes the windowed layers' KV cache to the context (256) and their window to 4096, and
onnxruntime refuses at the first token ("sliding_window_cache: KV cache capacity (256) must be at least
local_window_size (4096)"). A window wider than the context is no window: convert clamps it
(families.builder_config). The model here is a tiny Gemma-2 trained a few steps on the example task (its
logits are not flat, so int4 has something to agree with).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

from release.backends.onnxruntime_genai.families import builder_config
from release.cli import cli
from release.core.errors import EXIT_STAGE_FAILED
from tests.families.conftest import Shared, log_family_run
from tests.registry.test_crash_and_race import relctl_process

pytestmark = pytest.mark.slow

CONTEXT = 256


def test_a_window_wider_than_the_context_is_clamped_for_the_builder() -> None:
    config = {"architectures": ["Gemma2ForCausalLM"], "max_position_embeddings": 256, "sliding_window": 4096}
    assert builder_config(config)["sliding_window"] == 256
    assert config["sliding_window"] == 4096  # the checkpoint's own config is not changed
    # A window inside the context is a real window: left alone, on any family.
    mistral = {"architectures": ["MistralForCausalLM"], "max_position_embeddings": 8192, "sliding_window": 4096}
    assert builder_config(mistral) == mistral


@pytest.fixture(scope="module")
def short_gemma2(tmp_path_factory: pytest.TempPathFactory, tinyllm: ModuleType, family_shared: Shared) -> Path:
    """A tiny Gemma-2 at max_position_embeddings 256 and the config class's default sliding window."""
    import torch
    import transformers

    root = tmp_path_factory.mktemp("gemma2-short")
    tokenizer = tinyllm.load_tokenizer(family_shared.tokenizer_dir)
    config = transformers.Gemma2Config(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=CONTEXT,
        query_pre_attn_scalar=64)
    assert config.sliding_window > CONTEXT  # the class default this test is about
    config.architectures = ["Gemma2ForCausalLM"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = transformers.Gemma2ForCausalLM(config)
        tinyllm.train(model, tokenizer, family_shared.train_rows, 60, 3e-3, 32, 0)
    finally:
        torch.set_num_threads(threads)
    checkpoint = root / "checkpoint"
    model.save_pretrained(checkpoint)
    for path in family_shared.tokenizer_dir.iterdir():
        shutil.copy(path, checkpoint / path.name)
    assert json.loads((checkpoint / "config.json").read_text())["sliding_window"] > CONTEXT
    return checkpoint


def relctl(project: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--project-dir", str(project), *args])


def test_the_short_context_gemma2_releases_and_a_broken_build_is_exit_4(
        short_gemma2: Path, family_shared: Shared, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    run_id = log_family_run(project, short_gemma2, family_shared.data_dir, experiment="gemma2-short")
    result = relctl(project, "promote", run_id, "--precision", "fp32", "--json")
    assert result.exit_code == 0, result.output + result.stderr
    report = json.loads(result.stdout)
    assert report["outcome"] == "released"
    assert report["validation"]["metrics"]["top1_agreement"] == 1.0
    (genai_config,) = (project / ".relctl" / "work").glob("*/convert-*/model/genai_config.json")
    assert json.loads(genai_config.read_text())["model"]["decoder"]["sliding_window"]["window_size"] == CONTEXT

    # The same promote at int4, its built model broken between convert and validate the way the unclamped
    # build was: the graph's windowed attention wider than the KV cache genai_config sizes for it.
    marker = tmp_path / "paused"
    proc = relctl_process(project, "promote", run_id, "--precision", "int4", pause_at="stage-done:convert",
                          marker=marker)
    deadline = time.monotonic() + 600
    while not marker.is_file():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the promote never finished convert"
        time.sleep(0.1)
    (broken,) = [p for p in (project / ".relctl" / "work").glob("*/convert-*/model/genai_config.json")
                 if p != genai_config]
    config = json.loads(broken.read_text())
    config["model"]["decoder"]["sliding_window"]["window_size"] = CONTEXT // 2
    broken.write_text(json.dumps(config))
    marker.unlink()
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == EXIT_STAGE_FAILED, stderr
    assert "cannot run in its engine" in stderr and "local_window_size" in stderr, stderr
    assert "validation failed" not in stderr and "relax" not in stderr, stderr
