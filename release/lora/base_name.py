"""Is the adapter for this base? The names both sides record, compared before any tensor is read.

The adapter names its base in adapter_config.json (`base_model_name_or_path`, what peft was given); the
base names itself in config.json (`_name_or_path`: transformers 4 writes it, hub checkpoints carry it;
transformers 5 no longer does, so set it when saving a base you want checked). A local path (absolute,
`./`, `~`) names a folder on the training machine, not a model, so it is not compared; neither is a
missing name. Shapes are checked anyway (release/lora/adapter.py): this catches an adapter of another
model that happens to have the same shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ADAPTER_KEY = "base_model_name_or_path"
BASE_KEY = "_name_or_path"


@dataclass(frozen=True)
class NameCheck:
    error: str | None = None  # both sides name a model, and not the same one
    warning: str | None = None  # a side names none: not compared


def model_name(value: Any) -> str | None:
    """`value` as a model name, or None when it is empty or a local path."""
    if not isinstance(value, str) or not value.strip():
        return None
    name = value.strip().rstrip("/")
    if name.startswith(("/", ".", "~")) or "\\" in name or ":" in name:
        return None
    return name


def _same(a: str, b: str) -> bool:
    a, b = a.lower(), b.lower()
    # "Qwen/Qwen2.5-0.5B" and "Qwen2.5-0.5B" are one model when only one side records the organisation.
    return a == b or (("/" in a) != ("/" in b) and a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1])


def check_base_names(adapter_config: dict[str, Any], base_config: dict[str, Any]) -> NameCheck:
    """Compare the adapter's recorded base with the base's own name."""
    raw_adapter, raw_base = adapter_config.get(ADAPTER_KEY), base_config.get(BASE_KEY)
    adapter, base = model_name(raw_adapter), model_name(raw_base)
    if adapter is None or base is None:
        missing = [f"adapter_config.json {ADAPTER_KEY} ({raw_adapter!r})" if adapter is None else "",
                   f"config.json {BASE_KEY} ({raw_base!r})" if base is None else ""]
        return NameCheck(warning=f"adapter/base names not compared: {' and '.join(m for m in missing if m)} "
                                 "names no model (only shapes are checked)")
    if _same(adapter, base):
        return NameCheck()
    return NameCheck(error=f"adapter_config.json: the adapter was trained on '{adapter}' ({ADAPTER_KEY}) but "
                           f"the base is '{base}' (config.json {BASE_KEY})")


BASE_NAME_HINT = ("log the adapter with the base it was trained on; if the names are wrong, fix "
                  f"{ADAPTER_KEY} in adapter_config.json or {BASE_KEY} in config.json")
