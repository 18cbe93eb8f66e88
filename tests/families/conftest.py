"""Family matrix fixtures: one tokenizer and data set, and per family one trained checkpoint, built once.

The tokenizer, task and prompts are the example's (examples/tiny-llm/tinyllm.py). Each family's model is
built from its spec (tests/families/specs.py), trained for a few steps on the example task so its
logits are not flat (a quantized build of a random model agrees with its reference only by chance),
then given a PEFT LoRA adapter on the family's own module names, trained a few steps too (peft starts
lora_B at zero). Layout per family, under a session folder:
    base/      config.json, model.safetensors, tokenizer files (the trained base)
    adapter/   adapter_config.json, adapter_model.safetensors
    checkpoint/  base + adapter together: what a training run logs (README: Bring your own run)
Everything is built lazily, on the first test that asks for a family, and kept for the session.
"""

from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.families.specs import FAMILIES, build_config

LORA_STEPS = 10


@dataclass(frozen=True)
class Shared:
    tokenizer_dir: Path
    data_dir: Path  # validation/prompts.jsonl, eval.jsonl, train.jsonl
    train_rows: list[Any]


@dataclass(frozen=True)
class Built:
    family: str
    base: Path
    adapter: Path
    checkpoint: Path
    seconds: float


@pytest.fixture(scope="session")
def family_shared(tmp_path_factory: pytest.TempPathFactory, tinyllm: ModuleType) -> Shared:
    root = tmp_path_factory.mktemp("families")
    train_rows, eval_rows = tinyllm.make_task(0, 56)
    texts = [f"{r.prompt} {r.expected}" for r in train_rows + eval_rows]
    tinyllm.build_tokenizer(texts, root / "tokenizer")
    tinyllm.write_data(root / "data", train_rows, eval_rows)
    return Shared(root / "tokenizer", root / "data", train_rows)


@pytest.fixture(scope="session")
def family_checkpoint(tmp_path_factory: pytest.TempPathFactory, tinyllm: ModuleType,
                      family_shared: Shared) -> Callable[[str], Built]:
    """family name -> its trained base, adapter and combined checkpoint (built on first use)."""
    cache: dict[str, Built] = {}

    def get(name: str) -> Built:
        if name not in cache:
            cache[name] = _build(tmp_path_factory.mktemp(f"family-{name}"), name, tinyllm, family_shared)
        return cache[name]

    return get


def _build(root: Path, name: str, tinyllm: ModuleType, shared: Shared) -> Built:
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    started = time.perf_counter()
    family = FAMILIES[name]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: OpenMP's spinning threads cost more than they give
    try:
        tokenizer = tinyllm.load_tokenizer(shared.tokenizer_dir)
        config = build_config(family, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id,
                              tokenizer.pad_token_id)
        torch.manual_seed(0)
        model = getattr(transformers, family.model_class)(config)
        tinyllm.train(model, tokenizer, shared.train_rows, family.base_steps, 3e-3, 32, 0)
        base = root / "base"
        model.save_pretrained(base)
        for path in shared.tokenizer_dir.iterdir():
            shutil.copy(path, base / path.name)
        lora = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=list(family.lora_targets),
                          task_type="CAUSAL_LM")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # peft 0.21 reads an attribute transformers 5 deprecated
            peft_model = get_peft_model(model, lora)
        tinyllm.train(peft_model, tokenizer, shared.train_rows, LORA_STEPS, 5e-3, 32, 1)
        adapter = root / "adapter"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_model.save_pretrained(adapter)
        (adapter / "README.md").unlink(missing_ok=True)  # peft's model-card stub
    finally:
        torch.set_num_threads(threads)
    checkpoint = root / "checkpoint"
    shutil.copytree(base, checkpoint)
    for path in adapter.iterdir():
        shutil.copy(path, checkpoint / path.name)
    return Built(name, base, adapter, checkpoint, time.perf_counter() - started)


def log_family_run(project: Path, checkpoint: Path, data_dir: Path, experiment: str) -> str:
    """Log `checkpoint` as a training run the way the README's run contract asks; return the run id."""
    import mlflow

    from release.core.hashing import sha256_file
    from release.registry.store import connect, ensure_experiment, resolve_store

    store = resolve_store(project)
    connect(store)
    with mlflow.start_run(experiment_id=ensure_experiment(store, experiment)) as run:
        mlflow.log_artifacts(str(checkpoint), "checkpoint")
        mlflow.log_artifact(str(data_dir / "validation" / "prompts.jsonl"), "validation")
        mlflow.log_artifact(str(data_dir / "eval.jsonl"), "data")
        mlflow.set_tag("data.eval.sha256", sha256_file(data_dir / "eval.jsonl"))
        return str(run.info.run_id)
