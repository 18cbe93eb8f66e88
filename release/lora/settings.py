"""adapter_config.json: the LoRA options relctl can fold exactly, and a refusal for every other one.

The option names and their meaning are peft 0.21's `LoraConfig`. An option relctl does not know is
refused when it is set (truthy), so a newer peft feature never merges silently wrong.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.core.errors import InputError
from release.core.jsonfile import read_json_file

CONFIG_FILE = "adapter_config.json"
PEFT_HINT = "merge it with peft's merge_and_unload() and log the merged checkpoint instead of the adapter"

# Options that only describe training, naming or bookkeeping: they do not change the merged weights
# beyond what the adapter's tensors already say (which modules, which ranks, which biases).
NEUTRAL_OPTIONS = frozenset({
    "task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision",
    "inference_mode", "r", "target_modules", "exclude_modules", "lora_alpha", "lora_dropout",
    "fan_in_fan_out", "bias", "use_rslora", "modules_to_save", "init_lora_weights", "layers_to_transform",
    "layers_pattern", "rank_pattern", "alpha_pattern", "use_dora", "lora_bias", "runtime_config",
    "megatron_core", "qalora_group_size", "loftq_config", "eva_config", "corda_config", "lora_ga_config",
})
# Options peft merges differently from plain LoRA/DoRA (or not at all); refused when set.
UNSUPPORTED_OPTIONS = {
    "layer_replication": "replicated layers cannot be merged (peft refuses too)",
    "megatron_config": "Megatron parallel layers are not supported",
    "trainable_token_indices": "trainable-token adapters are not supported",
    "target_parameters": "LoRA on nn.Parameter targets (MoE experts) is not supported",
    "arrow_config": "Arrow routing is not a mergeable adapter",
    "use_bdlora": "block-diagonal LoRA is not supported",
    "alora_invocation_tokens": "activated LoRA (aLoRA) cannot be merged",
    "velora_config": "VeLoRA is not supported",
    "monteclora_config": "MonteCLoRA is not supported",
    "kasa_config": "KaSA is not supported",
    "use_qalora": "QA-LoRA is not supported",
    "ensure_weight_tying": "adapters tied across embedding and lm_head are not supported",
}
# Initialisations whose adapters are plain LoRA once trained. PiSSA, OLoRA, CorDA, LoftQ and LoRA-GA
# rewrite the base weights at load time, and MiCA is a separate variant: merging them onto the
# untouched base would be wrong.
PLAIN_INITS = (True, False, "gaussian", "eva", "orthogonal")
BIAS_MODES = ("none", "all", "lora_only")


@dataclass(frozen=True)
class LoraSettings:
    """The options of one LoRA adapter that decide how it folds into the base weights."""

    r: int
    lora_alpha: float
    use_rslora: bool
    use_dora: bool
    lora_bias: bool
    fan_in_fan_out: bool
    rank_pattern: Mapping[str, int]
    alpha_pattern: Mapping[str, float]
    base_model_name_or_path: str | None

    def rank_and_alpha(self, module: str) -> tuple[int, float]:
        """r and alpha for one module path, with peft's pattern rules (first regex that ends the path)."""
        r_key = _pattern_key(self.rank_pattern, module)
        alpha_key = _pattern_key(self.alpha_pattern, module)
        return self.rank_pattern.get(r_key, self.r), self.alpha_pattern.get(alpha_key, self.lora_alpha)

    def scaling(self, module: str) -> float:
        """alpha/r, or alpha/sqrt(r) for rsLoRA: the same Python float peft computes."""
        r, alpha = self.rank_and_alpha(module)
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r


def _pattern_key(patterns: Mapping[str, object], module: str) -> str:
    # peft's get_pattern_key: a key is a regex matched against the end of the full module path.
    for key in patterns:
        if re.match(rf"(.*\.)?({key})$", module):
            return key
    return module


def read_settings(adapter_dir: Path) -> LoraSettings:
    """Parse adapter_config.json and refuse every option relctl cannot fold exactly."""
    path = adapter_dir / CONFIG_FILE
    missing = InputError(
        f"{adapter_dir.name}: {CONFIG_FILE} is missing",
        hint="save the adapter with peft's save_pretrained (adapter_config.json + adapter_model.safetensors)",
    )
    data = read_json_file(path, missing, fix_hint="re-save the adapter")
    if not isinstance(data, dict):
        raise InputError(f"{CONFIG_FILE}: not a JSON object", hint="re-save the adapter with peft's save_pretrained")
    check_supported(data)
    return _settings(data)


def check_supported(data: dict[str, Any]) -> None:
    """Raise InputError naming the first adapter option that makes an exact merge impossible."""
    peft_type = data.get("peft_type")
    if peft_type != "LORA":
        raise InputError(f"{CONFIG_FILE}: peft_type {peft_type!r} is not supported; relctl merges LORA adapters",
                         hint=PEFT_HINT)
    for option, why in UNSUPPORTED_OPTIONS.items():
        if data.get(option):
            raise InputError(f"{CONFIG_FILE}: {option}={data[option]!r} is set; {why}", hint=PEFT_HINT)
    unknown = sorted(k for k, v in data.items() if k not in NEUTRAL_OPTIONS and k not in UNSUPPORTED_OPTIONS and v)
    if unknown:
        raise InputError(f"{CONFIG_FILE}: option {unknown[0]!r} is unknown to relctl (it knows peft 0.21's LoraConfig)",
                         hint=PEFT_HINT)
    init = data.get("init_lora_weights", True)
    if init not in PLAIN_INITS:
        raise InputError(
            f"{CONFIG_FILE}: init_lora_weights={init!r} changes the base weights when peft loads the adapter",
            hint="convert it to a plain LoRA adapter: "
                 "save_pretrained(..., path_initial_model_for_weight_conversion=...)",
        )
    if data.get("bias", "none") not in BIAS_MODES:
        raise InputError(f"{CONFIG_FILE}: bias={data.get('bias')!r} is not one of {', '.join(BIAS_MODES)}",
                         hint="re-save the adapter with a peft release that writes a valid bias mode")


def _settings(data: dict[str, Any]) -> LoraSettings:
    r = data.get("r", 8)
    alpha = data.get("lora_alpha", 8)
    rank_pattern = data.get("rank_pattern") or {}
    alpha_pattern = data.get("alpha_pattern") or {}
    if not isinstance(rank_pattern, dict) or not isinstance(alpha_pattern, dict):
        raise InputError(f"{CONFIG_FILE}: rank_pattern and alpha_pattern must be mappings",
                         hint="re-save the adapter with peft's save_pretrained")
    if not _is_positive_int(r) or not all(_is_positive_int(v) for v in rank_pattern.values()):
        raise InputError(f"{CONFIG_FILE}: r and rank_pattern values must be positive integers",
                         hint="re-save the adapter with peft's save_pretrained")
    if not all(_is_number(v) for v in (alpha, *alpha_pattern.values())):
        # NaN or Inf would scale every delta to NaN: a merged checkpoint of NaN weights, written with exit 0.
        raise InputError(f"{CONFIG_FILE}: lora_alpha and alpha_pattern values must be finite numbers",
                         hint="re-save the adapter with peft's save_pretrained")
    return LoraSettings(
        r=r,
        lora_alpha=alpha,
        use_rslora=bool(data.get("use_rslora", False)),
        use_dora=bool(data.get("use_dora", False)),
        lora_bias=bool(data.get("lora_bias", False)),
        fan_in_fan_out=bool(data.get("fan_in_fan_out", False)),
        rank_pattern=dict(rank_pattern),
        alpha_pattern=dict(alpha_pattern),
        base_model_name_or_path=data.get("base_model_name_or_path"),
    )


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
