"""The fp32 reference of a vLLM release, computed by PyTorch (transformers, in relctl's environment) from
the reference build's safetensors: the training framework's own numbers, which the candidate as vLLM
serves it is compared with. (It also saves starting a second vLLM server during validation.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from release.backends.base import Generation
from release.backends.vllm.model import FolderFacts


class TorchReference(FolderFacts):
    def __init__(self, model_dir: Path) -> None:
        import torch  # noqa: PLC0415 - relctl's [models] extra
        from transformers import AutoModelForCausalLM  # noqa: PLC0415

        self.model_dir = model_dir
        self._torch: Any = torch
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self._model: Any = model.eval()
        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._read_facts(model_dir)


    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids))

    def logits(self, ids: list[int]) -> np.ndarray:
        with self._torch.no_grad():
            out = self._model(self._torch.tensor([ids]))
        return np.asarray(out.logits[0].float().numpy(), dtype=np.float32)

    def generate_ids(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        generated: list[int] = []
        past, step = None, list(input_ids)
        while len(generated) < max_new_tokens and len(input_ids) + len(generated) < self._context:
            with self._torch.no_grad():
                out = self._model(self._torch.tensor([step]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = int(out.logits[0, -1].argmax())
            generated.append(token)
            if token in self._eos:
                break
            step = [token]
        return generated

    def generate(self, prompt: str, max_new_tokens: int) -> Generation:
        ids = self.encode(prompt)
        generated = self.generate_ids(ids, max_new_tokens)
        finish = "stop" if generated and generated[-1] in self._eos else "length"
        return Generation(text=self.decode(generated), token_ids=generated, prompt_tokens=len(ids),
                          finish_reason=finish)
