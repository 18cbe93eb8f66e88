"""The GPU catalogue: memory and an indicative price per hour for each accelerator, from gpus.json, with
the user's additions and overrides from release.yaml (`gates.memory.gpus`)."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from release.core.errors import InputError


class GpuSpec(BaseModel):
    """One accelerator; `price_per_hour` is for one device, in the user's currency (the catalogue: USD)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_gib: float = Field(gt=0, description="device memory in GiB")
    price_per_hour: float | None = Field(default=None, ge=0, description="price of one device per hour")


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    price_per_hour: float | None


def _key(name: str) -> str:
    # "H100 80GB", "h100-80gb" and "H100_80GB" are the same card.
    return re.sub(r"[\s_\-]+", "", name).lower()


def load_catalogue(extra: Mapping[str, GpuSpec] | None = None) -> dict[str, Gpu]:
    """Built-in GPUs plus `extra` (release.yaml's additions; a name already listed is overridden)."""
    raw = json.loads(resources.files("release.memory").joinpath("gpus.json").read_text())
    gpus = {name: Gpu(name, float(spec["memory_gib"]), spec.get("price_per_hour"))
            for name, spec in raw["gpus"].items()}
    for name, spec in (extra or {}).items():
        existing = next((g for g in gpus.values() if _key(g.name) == _key(name)), None)
        if existing is not None:
            del gpus[existing.name]
            price = spec.price_per_hour if spec.price_per_hour is not None else existing.price_per_hour
            gpus[existing.name] = Gpu(existing.name, spec.memory_gib, price)
        else:
            gpus[name] = Gpu(name, spec.memory_gib, spec.price_per_hour)
    return gpus


def find_gpu(name: str, catalogue: Mapping[str, Gpu]) -> Gpu:
    """The catalogue entry for `name` (case, spaces and dashes ignored); InputError with a did-you-mean."""
    by_key = {_key(g.name): g for g in catalogue.values()}
    if _key(name) in by_key:
        return by_key[_key(name)]
    # A prefix ("h100") names a family: suggest its first member before a merely similar name ("h200").
    prefixed = sorted(k for k in by_key if k.startswith(_key(name)))
    close = prefixed[:1] or difflib.get_close_matches(_key(name), list(by_key), n=1, cutoff=0.5)
    hint = (f"did you mean '{by_key[close[0]].name}'?" if close
            else f"known GPUs: {', '.join(sorted(catalogue))}; add yours under gates.memory.gpus in release.yaml")
    raise InputError(f"--gpu: unknown GPU '{name}'", hint=hint)
