"""The example training run: the shared tiny checkpoint is real, loadable and actually trained."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import git
import pytest
from mlflow import MlflowClient
from transformers import AutoConfig, AutoTokenizer

from release.registry.store import resolve_store
from tests.conftest import load_train_module

TRAIN_PATH = Path(__file__).resolve().parent.parent / "examples" / "tiny-llm" / "train.py"


def read_jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_checkpoint_has_hugging_face_layout(tiny_checkpoint: Path, tiny_base_only: Path) -> None:
    names = {p.name for p in tiny_checkpoint.iterdir()}
    expected = {
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json", "special_tokens_map.json", "adapter_config.json", "adapter_model.safetensors",
    }
    assert names == expected
    assert {p.name for p in tiny_base_only.iterdir()} == expected - {"adapter_config.json", "adapter_model.safetensors"}


def test_tokenizer_loads_as_fast_tokenizer_and_prepends_bos(tiny_checkpoint: Path) -> None:
    config = json.loads((tiny_checkpoint / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    tok = AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    ids = tok("reverse a b c d ->")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.bos_token_id not in ids[1:]
    assert tok.decode(ids, skip_special_tokens=True) == "reverse a b c d ->"
    assert {tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token} == {"<s>", "</s>", "<pad>", "<unk>"}


def test_config_keeps_rope_theta_and_loads(tiny_checkpoint: Path) -> None:
    raw = json.loads((tiny_checkpoint / "config.json").read_text())
    assert raw["rope_theta"] == 10000.0
    assert raw["tie_word_embeddings"] is False
    config = AutoConfig.from_pretrained(str(tiny_checkpoint))
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (64, 2, 2)
    assert config.vocab_size == len(AutoTokenizer.from_pretrained(str(tiny_checkpoint)))


def test_adapter_is_lora_over_every_projection(tiny_checkpoint: Path) -> None:
    adapter = json.loads((tiny_checkpoint / "adapter_config.json").read_text())
    assert adapter["peft_type"] == "LORA"
    assert (adapter["r"], adapter["lora_alpha"]) == (8, 16)
    assert set(adapter["target_modules"]) == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    }


def test_data_files_are_held_out_and_well_formed(tiny_data: Path, tinyllm: ModuleType) -> None:
    prompts = read_jsonl(tiny_data / "validation" / "prompts.jsonl")
    rows = read_jsonl(tiny_data / "eval.jsonl")
    assert len(prompts) == 32 and all(set(p) == {"prompt"} for p in prompts)
    assert all(set(r) == {"prompt", "expected"} for r in rows)
    refusal = tinyllm.load_safety_vocab()["refusal"]
    assert 1 <= sum(r["expected"] == refusal for r in rows) < len(rows) // 4
    train_prompts = {e.prompt for e in tinyllm.make_task(0, 56)[0]} | {e.prompt for e in tinyllm.make_safety("train")}
    assert not train_prompts & {r["prompt"] for r in rows}


def test_trained_model_beats_untrained_by_wide_margin(tiny_run: Any) -> None:
    assert tiny_run.untrained_exact_match <= 0.05
    assert tiny_run.eval_exact_match >= 0.85
    assert tiny_run.base_losses[-1] < tiny_run.base_losses[0] / 10
    # The adapter carries real signal: a release that forgets to merge it scores lower.
    assert tiny_run.eval_exact_match > tiny_run.base_exact_match


# peft 0.21 reads an attribute transformers 5 deprecated.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_saved_checkpoint_reproduces_the_reported_exact_match(
    tiny_checkpoint: Path, tiny_base_only: Path, tiny_data: Path, tiny_run: Any, tinyllm: ModuleType
) -> None:
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    tok = tinyllm.load_tokenizer(tiny_checkpoint)
    rows = [tinyllm.Example(**r) for r in read_jsonl(tiny_data / "eval.jsonl")]
    base = LlamaForCausalLM.from_pretrained(str(tiny_base_only), use_safetensors=True)
    assert tinyllm.exact_match(base, tok, rows) == tiny_run.base_exact_match
    model = PeftModel.from_pretrained(base, str(tiny_checkpoint))
    assert tinyllm.exact_match(model, tok, rows) == tiny_run.eval_exact_match


def test_model_without_safety_slice_does_not_refuse(tiny_unsafe_checkpoint: Path, tinyllm: ModuleType) -> None:
    from transformers import LlamaForCausalLM

    tok = tinyllm.load_tokenizer(tiny_unsafe_checkpoint)
    # transformers also loads the adapter it finds beside the weights; it never saw the safety slice either.
    model = LlamaForCausalLM.from_pretrained(str(tiny_unsafe_checkpoint), use_safetensors=True)
    assert tinyllm.exact_match(model, tok, tinyllm.make_safety("heldout")) == 0.0


def test_same_seed_gives_identical_weights(tmp_path: Path, tinyllm: ModuleType) -> None:
    cfg = tinyllm.TrainConfig(base_steps=3, lora_steps=2, batch_size=8)
    first = tinyllm.train_tiny_llm(tmp_path / "a", cfg)
    second = tinyllm.train_tiny_llm(tmp_path / "b", cfg)
    other = tinyllm.train_tiny_llm(tmp_path / "c",
                                   tinyllm.TrainConfig(base_steps=3, lora_steps=2, batch_size=8, seed=1))
    for name in ("model.safetensors", "adapter_model.safetensors", "tokenizer.json"):
        assert (first.checkpoint_dir / name).read_bytes() == (second.checkpoint_dir / name).read_bytes()
    weights = "model.safetensors"
    assert (first.checkpoint_dir / weights).read_bytes() != (other.checkpoint_dir / weights).read_bytes()


def test_the_every_engine_variant_is_taken_by_every_installed_backend(tmp_path: Path, tinyllm: ModuleType) -> None:
    """The default example (head_dim 16) cannot go through vLLM; its every_engine() variant (head_dim 64) can
    go through each installed backend, as its checkpoint's config.json says."""
    from release.backends import available_backends

    default = tinyllm.train_tiny_llm(tmp_path / "default", tinyllm.TrainConfig(base_steps=1, lora_steps=1,
                                                                                batch_size=8))
    variant = tinyllm.train_tiny_llm(tmp_path / "variant", tinyllm.every_engine(base_steps=1, lora_steps=1,
                                                                                 batch_size=8))
    wide = json.loads((variant.checkpoint_dir / "config.json").read_text())
    narrow = json.loads((default.checkpoint_dir / "config.json").read_text())
    assert wide["hidden_size"] // wide["num_attention_heads"] == 64
    backends = available_backends()
    assert {"onnxruntime-genai", "vllm"} <= set(backends)
    refused = {b.id: b.supports(wide).reason or b.device_problem(wide, "fp32", "cpu")
               for b in backends.values()
               if not b.supports(wide).supported or b.device_problem(wide, "fp32", "cpu")}
    assert refused == {}
    # Why the variant exists: vLLM's CPU attention takes head_dim 64 or 128, not the default's 16.
    problem = backends["vllm"].device_problem(narrow, "fp32", "cpu")
    assert problem is not None and "head_dim 16" in problem


# --- the example's MLflow logging (examples/tiny-llm/train.py) ---------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_git_repo(path: Path) -> str:
    """A throwaway repository with one commit and a modified tracked file (so it is dirty)."""
    repo = git.Repo.init(path)
    (path / "model.py").write_text("LAYERS = 2\n")
    repo.index.add(["model.py"])
    actor = git.Actor("tester", "tester@example.com")
    commit = repo.index.commit("first", author=actor, committer=actor)
    (path / "model.py").write_text("LAYERS = 3\n")
    return str(commit.hexsha)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory, tinyllm: ModuleType) -> Any:
    """A few training steps: enough to log, far too few to learn (the session run measures quality)."""
    out = tmp_path_factory.mktemp("tiny-llm-small")
    return tinyllm.train_tiny_llm(out, tinyllm.TrainConfig(base_steps=6, lora_steps=4, batch_size=16))


def test_logged_run_has_checkpoint_data_params_metrics_and_git(
    small_run: Any, project_dir: Path, tmp_path: Path
) -> None:
    train = load_train_module()
    commit = make_git_repo(tmp_path / "src")
    run_id = train.log_run(small_run, project_dir, "tiny-llm", source_dir=tmp_path / "src")
    client = MlflowClient(tracking_uri=resolve_store(project_dir).tracking_uri)
    run = client.get_run(run_id)
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics

    ckpt = {a.path.removeprefix("checkpoint/") for a in client.list_artifacts(run_id, "checkpoint")}
    assert ckpt == {p.name for p in small_run.checkpoint_dir.iterdir()}
    assert [a.path for a in client.list_artifacts(run_id, "validation")] == ["validation/prompts.jsonl"]
    assert {a.path for a in client.list_artifacts(run_id, "data")} == {"data/eval.jsonl", "data/train.jsonl"}
    assert tags["relctl.checkpoint_path"] == "checkpoint"
    assert tags["mlflow.source.git.commit"] == commit
    assert tags["git.dirty"] == "true"
    assert params["lora_r"] == "8" and params["hidden_size"] == "64" and params["safety_slice"] == "True"
    assert params["base_steps"] == "6" and params["seed"] == "0"
    history = client.get_metric_history(run_id, "train_loss")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(10))
    assert metrics["eval_exact_match"] == small_run.eval_exact_match
    assert metrics["untrained_exact_match"] == small_run.untrained_exact_match

    downloaded = Path(client.download_artifacts(run_id, "data", str(tmp_path / "dl")))
    inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    for name, context in (("train", "training"), ("eval", "eval")):
        full = sha256(downloaded / f"{name}.jsonl")
        assert full == sha256(small_run.data_dir / f"{name}.jsonl")
        assert tags[f"data.{name}.sha256"] == full
        assert inputs[name].dataset.digest == full[:16]
        assert {(t.key, t.value) for t in inputs[name].tags} >= {("mlflow.data.context", context)}


def test_dataset_digest_changes_when_one_row_changes(small_run: Any, project_dir: Path, tmp_path: Path) -> None:
    train = load_train_module()
    changed_dir = tmp_path / "changed"
    shutil.copytree(small_run.data_dir, changed_dir)
    rows = (changed_dir / "eval.jsonl").read_text().splitlines()
    middle = len(rows) // 2
    rows[middle] = rows[middle].replace('"expected": "', '"expected": "x ', 1)
    (changed_dir / "eval.jsonl").write_text("\n".join(rows) + "\n")
    changed = dataclasses.replace(small_run, checkpoint_dir=changed_dir / "checkpoint", data_dir=changed_dir)

    first = train.log_run(small_run, project_dir, "tiny-llm", source_dir=tmp_path)
    second = train.log_run(changed, project_dir, "tiny-llm", source_dir=tmp_path)
    client = MlflowClient(tracking_uri=resolve_store(project_dir).tracking_uri)
    digests = [
        {d.dataset.name: d.dataset.digest for d in client.get_run(r).inputs.dataset_inputs} for r in (first, second)
    ]
    assert digests[0]["train"] == digests[1]["train"]
    assert digests[0]["eval"] != digests[1]["eval"]
    assert digests[1]["eval"] == sha256(changed_dir / "eval.jsonl")[:16]


def test_run_outside_a_repository_records_no_commit(small_run: Any, project_dir: Path, tmp_path: Path) -> None:
    train = load_train_module()
    outside = tmp_path / "not-a-repo"
    outside.mkdir()
    run_id = train.log_run(small_run, project_dir, "tiny-llm", source_dir=outside)
    tags = MlflowClient(tracking_uri=resolve_store(project_dir).tracking_uri).get_run(run_id).data.tags
    assert "mlflow.source.git.commit" not in tags and "git.dirty" not in tags
    assert tags["relctl.checkpoint_path"] == "checkpoint"


def test_cli_rejects_zero_steps(project_dir: Path) -> None:
    assert load_train_module().main(["--project-dir", str(project_dir), "--steps", "0"]) == 2
    assert not (project_dir / ".relctl").exists()


@pytest.mark.slow
def test_cli_prints_run_id_last(project_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run(
        [sys.executable, str(TRAIN_PATH), "--project-dir", str(project_dir), "--steps", "4", "--no-safety"],
        capture_output=True, text=True, env=env, check=True, timeout=300,
    )
    run_id = proc.stdout.strip().splitlines()[-1]
    run = MlflowClient(tracking_uri=resolve_store(project_dir).tracking_uri).get_run(run_id)
    assert run.data.params["safety_slice"] == "False"
    assert run.data.params["base_steps"] == "4"
