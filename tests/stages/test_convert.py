"""convert: real builder runs on the trained tiny Llama, real ORT sessions, transformers as the reference."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM

from release.backends.onnxruntime_genai.model import GenaiModel
from release.core.errors import InputError, StageFailed
from release.stages.convert import ConvertOutputs, convert, convert_log
from release.stages.merge import merge_checkpoint
from release.stages.validate import load_prompts

N_PROMPTS = 8


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    out = tmp_path_factory.mktemp("convert") / "merged"
    merge_checkpoint(tiny_checkpoint, tiny_checkpoint, out)
    return out


@pytest.fixture(scope="module")
def fp32(merged: Path) -> ConvertOutputs:
    return convert(merged, merged.parent / "onnx-fp32", "fp32")


@pytest.fixture(scope="module")
def int4(merged: Path) -> ConvertOutputs:
    return convert(merged, merged.parent / "onnx-int4", "int4")


@pytest.fixture(scope="module")
def prompts(tiny_data: Path) -> list[str]:
    return load_prompts(tiny_data / "validation" / "prompts.jsonl")[:N_PROMPTS]


@pytest.fixture(scope="module")
def hf_model(merged: Path) -> Any:
    return LlamaForCausalLM.from_pretrained(str(merged)).eval()


def training_ids(checkpoint: Path, text: str) -> list[int]:
    return list(Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(text).ids)


def test_fp32_logits_match_transformers(fp32: ConvertOutputs, merged: Path, hf_model: Any, prompts: list[str]) -> None:
    model = GenaiModel.load(fp32.out_dir)
    worst = 0.0
    for prompt in prompts:
        ids = training_ids(merged, prompt)
        with torch.no_grad():
            expected = hf_model(torch.tensor([ids])).logits[0].numpy()
        got = model.logits(ids)
        assert got.shape == expected.shape
        worst = max(worst, float(np.abs(got - expected).max()))
    assert worst < 1e-4


def test_fp32_greedy_generation_matches_transformers(
    fp32: ConvertOutputs, merged: Path, hf_model: Any, prompts: list[str]
) -> None:
    model = GenaiModel.load(fp32.out_dir)
    eos = hf_model.generation_config.eos_token_id
    for prompt in prompts:
        ids = training_ids(merged, prompt)
        with torch.no_grad():
            out = hf_model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=12, do_sample=False, pad_token_id=eos,
            )
        expected = out[0, len(ids):].tolist()
        generation = model.generate(prompt, 12)
        assert generation.token_ids == expected, prompt
        assert generation.prompt_tokens == len(ids)
        assert generation.text == model.decode(expected)


def test_convert_result_records_tools_files_and_log(fp32: ConvertOutputs) -> None:
    out = fp32.out_dir
    assert {"model.onnx", "model.onnx.data", "genai_config.json", "tokenizer.json", "tokenizer_config.json"} <= set(
        fp32.files
    )
    assert all(fp32.files[name] == (out / name).stat().st_size for name in fp32.files)
    assert set(fp32.versions) == {"onnxruntime-genai", "onnx", "onnxruntime"}
    assert fp32.versions["onnxruntime-genai"][0].isdigit()
    assert fp32.backend == "onnxruntime-genai" and fp32.precision == "fp32"
    assert fp32.wall_time_s > 0
    # The log sits beside the folder (the folder is what gets packaged), and holds the builder's output.
    log = convert_log(out)
    assert log.parent == out.parent and "Saving GenAI config" in log.read_text()
    assert not out.with_name(out.name + ".partial").exists()
    assert fp32.total_bytes == sum(fp32.files.values()) == sum((out / n).stat().st_size for n in fp32.files)


def test_served_tokenizer_is_the_training_one_with_bos(fp32: ConvertOutputs, merged: Path, prompts: list[str]) -> None:
    out = fp32.out_dir
    assert (out / "tokenizer.json").read_bytes() == (merged / "tokenizer.json").read_bytes()
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["add_bos_token"] is True and cfg["bos_token"] == "<s>"
    model = GenaiModel.load(out)
    # The parity check convert runs reads the tokenizer without loading the weights: the same ids.
    served = GenaiModel.served_tokenizer(out)
    for text in [*prompts, "", "naïve ✓"]:
        assert model.encode(text) == training_ids(merged, text) == served(text)
    assert fp32.tokenizer_parity is True


def test_int4_really_quantizes(fp32: ConvertOutputs, int4: ConvertOutputs, merged: Path, prompts: list[str]) -> None:
    graph = onnx.load(str(int4.out_dir / "model.onnx"), load_external_data=False).graph
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    # 2 layers x (qkv, o, gate, up, down) + lm_head: every projection has in_features divisible by 32.
    assert len(nbits) >= 11
    assert all(next(a.i for a in n.attribute if a.name == "bits") == 4 for n in nbits)
    assert int4.files["model.onnx.data"] < 0.5 * fp32.files["model.onnx.data"]
    ids = training_ids(merged, prompts[0])
    diff = np.abs(GenaiModel.load(int4.out_dir).logits(ids) - GenaiModel.load(fp32.out_dir).logits(ids)).max()
    assert diff > 1e-3


def test_refuses_folder_without_config_json(tmp_path: Path, tiny_base_only: Path) -> None:
    broken = tmp_path / "no-config"
    shutil.copytree(tiny_base_only, broken)
    (broken / "config.json").unlink()
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"config\.json is missing") as info:
        convert(broken, out, "fp32")
    assert info.value.hint and "config.json" in info.value.hint
    assert not out.exists() and not out.with_name("out.partial").exists()


def test_refuses_unmerged_adapter(tmp_path: Path, tiny_checkpoint: Path) -> None:
    with pytest.raises(InputError, match="unmerged adapter"):
        convert(tiny_checkpoint, tmp_path / "out", "fp32")


def test_refuses_pickle_weights(tmp_path: Path, tiny_base_only: Path) -> None:
    folder = tmp_path / "pickled"
    shutil.copytree(tiny_base_only, folder)
    (folder / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(InputError, match="pickle"):
        convert(folder, tmp_path / "out", "fp32")


@pytest.mark.parametrize(
    ("precision", "backend", "provider", "message"),
    [
        ("bf16", "auto", "cpu", "precision bf16 is not one of"),
        ("fp32", "tensorrt", "cpu", "backend 'tensorrt' is not installed"),
        ("fp32", "auto", "rocm", "execution provider rocm is not one of"),
        ("fp16", "onnxruntime-genai", "cpu", "fp16 on execution provider 'cpu'"),
    ],
)
def test_refuses_unsupported_combinations(
    tmp_path: Path, tiny_base_only: Path, precision: str, backend: str, provider: str, message: str
) -> None:
    with pytest.raises(InputError, match=message) as info:
        convert(tiny_base_only, tmp_path / "out", precision, backend, provider)
    assert info.value.hint
    assert not (tmp_path / "out").exists()


def test_builder_failure_is_a_stage_error_with_its_log(tmp_path: Path, tiny_base_only: Path) -> None:
    folder = tmp_path / "mismatched"
    shutil.copytree(tiny_base_only, folder)
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] = 2 * config["hidden_size"]  # the weights no longer fit the config
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(StageFailed, match="model builder failed") as info:
        convert(folder, tmp_path / "out", "fp32")
    assert info.value.hint and str(tmp_path / "out.convert.log") in info.value.hint
    assert (tmp_path / "out.convert.log").stat().st_size > 0
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small BERT classifier: an architecture no installed backend serves."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, num_labels=3)
    folder = tmp_path_factory.mktemp("bert") / "checkpoint"
    BertForSequenceClassification(config).eval().save_pretrained(str(folder))
    return folder


def test_unsupported_family_is_refused_naming_the_backends(tmp_path: Path, tiny_bert: Path) -> None:
    with pytest.raises(InputError, match=r"BertForSequenceClassification.*not supported") as info:
        convert(tiny_bert, tmp_path / "out", "fp32")
    assert info.value.hint and "onnxruntime-genai" in info.value.hint and "Llama" in info.value.hint
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
