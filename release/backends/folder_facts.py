"""What every model built as a Hugging Face folder shares, whichever engine runs it: its context length and
EOS ids (read once from config.json / generation_config.json) and greedy generation on top of the engine's
own encode / decode / generate_ids. The model vLLM serves and the PyTorch reference both build on it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from release.backends.base import Generation
from release.core.errors import InputError
from release.core.jsonfile import load_json_object, optional


def model_facts(model_dir: Path) -> tuple[dict[str, Any], list[int]]:
    """config.json and the EOS ids (generation_config.json's, else config.json's)."""
    hint = "rebuild the folder with relctl convert"
    config = load_json_object(model_dir / "config.json", hint)
    generation = load_json_object(model_dir / "generation_config.json", hint, missing_ok=True)
    label = f"{model_dir.name}/generation_config.json"
    eos = optional(generation, "eos_token_id", (int, list), label, hint)
    if eos is None:
        label = f"{model_dir.name}/config.json"
        eos = optional(config, "eos_token_id", (int, list), label, hint)
    ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
    if not all(isinstance(e, int) and not isinstance(e, bool) for e in ids):
        raise InputError(f"{label}: 'eos_token_id' holds a value that is not a token id", hint=hint)
    return config, [int(e) for e in ids]


class FolderFacts(ABC):
    """The context length and EOS ids of a built folder, read once (model_facts): shared by the model vLLM
    serves and the PyTorch reference beside it."""

    _context: int
    _eos: list[int]

    def _read_facts(self, model_dir: Path) -> dict[str, Any]:
        config, eos = model_facts(model_dir)
        self._eos = list(eos)
        self._context = int(config.get("max_position_embeddings", 2048))
        return config

    @property
    def context_length(self) -> int:
        return self._context

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self._eos)

    # What a subclass provides; generate builds on them.
    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: list[int]) -> str: ...

    @abstractmethod
    def generate_ids(self, input_ids: list[int], max_new_tokens: int) -> list[int]: ...

    def generate(self, prompt: str, max_new_tokens: int) -> Generation:
        ids = self.encode(prompt)
        generated = self.generate_ids(ids, max_new_tokens)
        finish = "stop" if generated and generated[-1] in self._eos else "length"
        return Generation(text=self.decode(generated), token_ids=generated, prompt_tokens=len(ids),
                          finish_reason=finish)
