"""LoRA adapters on a running vLLM base (docs/adapters.md): the PEFT folder vLLM loads, the flags that turn
LoRA serving on, and load/unload at run time through vLLM's own endpoints (VLLM_ALLOW_RUNTIME_LORA_UPDATING).

vLLM applies the adapter unmerged (its punica kernels; on CPU the torch fallback), at the base's dtype:
exactly the path vLLM issues #5148 and #10798 found diverging from PEFT, so an adapter release validates
it as served against the merged fp32 reference.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from release.backends.base import ServerCommand
from release.core.errors import InputError
from release.core.jsonfile import load_json_object

FILES = ("adapter_config.json", "adapter_model.safetensors")
# vLLM's --max-lora-rank takes these values only (vllm/config/lora.py MaxLoRARanks).
RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
RUNTIME_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
# Distinct adapters in one batch (--max-loras; --max-cpu-loras defaults to it). vLLM 0.32 does not refuse a
# 17th load: its worker's LRU cache evicts the oldest and re-reads it from its folder at its next request.
SLOTS = 16
HINT = "release this run merged instead: relctl promote RUN (without --onto)"


def adapter_config(folder: Path) -> dict[str, Any]:
    return load_json_object(folder / FILES[0], "re-save the adapter with peft's save_pretrained",
                            f"{folder.name}/{FILES[0]}")


def export(adapter_dir: Path, out: Path) -> None:
    """The PEFT folder as vLLM loads it, refused here for what vLLM would refuse or silently ignore."""
    cfg = adapter_config(adapter_dir)
    label = f"{adapter_dir.name}/{FILES[0]}"
    if cfg.get("peft_type") != "LORA":
        raise InputError(f"{label}: peft_type {cfg.get('peft_type')!r}; vLLM serves LoRA adapters only", hint=HINT)
    for option, why in (("use_dora", "DoRA"), ("modules_to_save", "modules_to_save (whole replaced modules)"),
                        ("use_rslora", "rsLoRA scaling")):
        if cfg.get(option):
            raise InputError(f"{label}: {why} is not served by vLLM's LoRA layers", hint=HINT)
    if any(cfg.get(key) for key in ("rank_pattern", "alpha_pattern")):
        raise InputError(f"{label}: per-module rank/alpha patterns are not served by vLLM's LoRA layers", hint=HINT)
    rank = cfg.get("r")
    if not isinstance(rank, int) or rank < 1 or rank > RANKS[-1]:
        raise InputError(f"{label}: rank r={rank!r}; vLLM serves ranks 1 to {RANKS[-1]}", hint=HINT)
    out.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        shutil.copy2(adapter_dir / name, out / name)


def max_rank(ranks: list[int], floor: int = 16) -> int:
    """The --max-lora-rank that holds every adapter's rank (and `floor`, so a later load of a rank-16 one fits)."""
    need = max([floor, *ranks])
    return next(r for r in RANKS if r >= need)


def lora_args(adapters: Mapping[str, Path], slots: int = SLOTS) -> list[str]:
    """vLLM's flags for LoRA serving with `adapters` (engine name: folder) loaded at start."""
    return flags(adapters, [int(adapter_config(folder).get("r") or 0) for folder in adapters.values()], slots)


def flags(adapters: Mapping[str, Path | str], ranks: list[int], slots: int = SLOTS) -> list[str]:
    """The flags for `adapters` (name: folder, where the server reads it) of these LoRA `ranks`: the one
    spelling the runner and a deployment manifest (relctl render kserve --adapters) share."""
    args = ["--enable-lora", "--max-loras", str(max(slots, len(adapters), 1)), "--max-lora-rank", str(max_rank(ranks))]
    if adapters:
        args += ["--lora-modules", *(f"{name}={folder}" for name, folder in adapters.items())]
    return args


def load(http: httpx.Client, name: str, folder: Path) -> None:
    response = http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(folder)}, timeout=120)
    if response.status_code != 200:
        raise InputError(f"vLLM refused adapter {name}: HTTP {response.status_code}: {response.text[:300]}",
                         hint="check the adapter's rank against the server's --max-lora-rank (docs/adapters.md)")


def unload(http: httpx.Client, name: str) -> None:
    response = http.post("/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)
    if response.status_code != 200:
        raise InputError(f"vLLM could not unload adapter {name}: HTTP {response.status_code}: {response.text[:300]}",
                         hint="GET /v1/models on the engine lists what is loaded")


def with_lora(command: ServerCommand, adapters: Mapping[str, Path]) -> ServerCommand:
    """`command` (the backend's server_command) with LoRA serving on and `adapters` loaded at start."""
    return ServerCommand(argv=[*command.argv, *lora_args(adapters)], env={**command.env, **RUNTIME_ENV},
                         health_path=command.health_path)
