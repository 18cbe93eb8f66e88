"""The reference validation compares a candidate with: PyTorch eager (transformers, in relctl's environment)
on a checkpoint, the training framework's own numbers.

Shared by the backends: the vLLM backend points it at its fp32 reference build, the onnxruntime-genai
backend at the merged checkpoint itself, so no fp32 ONNX is built just to be compared with.

Memory: the weights stay in the dtype they are stored in (a bf16 checkpoint is held at 2 bytes a
parameter, not 4), and each module's weights are widened to fp32 only while that module runs, so every
computation is fp32 (bf16 and fp16 widen to fp32 exactly: the numbers are those of an fp32 load) while
the resident model is the checkpoint's size plus one module's fp32 copy.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np

from release.backends.folder_facts import FolderFacts
from release.core.tokenizer_file import load_tokenizer

BATCH = 8  # prompts per forward pass: a weight read serves them all; logits memory grows with it


def widen_while_running(model: Any, torch: Any) -> int:
    """Make every module whose own parameters are not fp32 run on an fp32 copy of them, made just before
    its forward and dropped just after. Returns how many modules were wrapped (0 for an fp32 model).

    The embedding table and the vocabulary projection are never widened whole (the largest weights of a
    small model): a lookup is widened after the gather, the projection a slice of rows at a time. The
    other copies are written into one fp32 buffer sized for the largest module, allocated once: allocating a
    fresh copy per module per forward made the kernel fault in and zero every page of it each time (the
    widening then cost as much as the computation: 16.3 s against 8.4 s for an fp32 load, 0.5B, 8 prompts,
    32 new tokens; see benchmarks/results/scaling.json for the stage's time now). A module that runs while
    another holds the buffer (nested own parameters) gets fresh copies instead."""
    output_embeddings = model.get_output_embeddings()
    modules = []
    for module in model.modules():
        params = [p for p in module.parameters(recurse=False) if p.is_floating_point() and p.dtype != torch.float32]
        if not params:
            continue
        # Exactly these classes: a subclass's own forward (Gemma's scaled embedding) may compute in the
        # weight's dtype, so it is widened like any other module.
        if type(module) is torch.nn.Embedding:
            # A lookup widened after the gather is the same numbers as one from a widened table, without
            # an fp32 copy of the whole table (151,936 x 1,536 x 4 bytes = 0.93 GB at Qwen2.5-1.5B).
            module.register_forward_hook(lambda mod, args, output: output.float())
        elif module is output_embeddings and type(module) is torch.nn.Linear:
            module.forward = _chunked_linear(module, torch)  # the vocabulary projection, a slice at a time
        else:
            modules.append((module, params))
    scratch = torch.empty(max((sum(p.numel() for p in params) for _, params in modules), default=0),
                          dtype=torch.float32)
    busy = [False]

    for module, params in modules:
        def widen(mod: Any, args: Any, params: list[Any] = params) -> None:
            mod._relctl_scratch = not busy[0]
            busy[0] = True  # held by this module, or already by an outer one
            offset = 0
            for p in params:
                p._stored = p.data
                if mod._relctl_scratch:
                    p.data = scratch[offset:offset + p.numel()].view(p.shape).copy_(p._stored)
                    offset += p.numel()
                else:
                    p.data = p._stored.float()

        def restore(mod: Any, args: Any, output: Any, params: list[Any] = params) -> None:
            for p in params:
                p.data = p._stored
                del p._stored
            if mod._relctl_scratch:
                busy[0] = False

        module.register_forward_pre_hook(widen)
        module.register_forward_hook(restore)
    # Buffers (rotary frequencies, ...) are small: widened once.
    for name, buffer in list(model.named_buffers()):
        if buffer.is_floating_point() and buffer.dtype != torch.float32:
            owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            owner.register_buffer(name.rpartition(".")[2], buffer.float(), persistent=False)
    return len(modules)


VOCAB_ROWS = 8192  # rows of the vocabulary projection widened at a time


def _chunked_linear(module: Any, torch: Any) -> Any:
    """The forward of a low-precision Linear computed in fp32 VOCAB_ROWS output rows at a time: the fp32
    copy is a slice of the weight, not all of it (each output is the same dot product either way)."""
    def forward(hidden: Any) -> Any:
        weight, bias = module.weight, module.bias
        hidden = hidden.float()
        out = hidden.new_empty(*hidden.shape[:-1], weight.shape[0])
        for r0 in range(0, weight.shape[0], VOCAB_ROWS):
            r1 = min(weight.shape[0], r0 + VOCAB_ROWS)
            out[..., r0:r1] = torch.nn.functional.linear(
                hidden, weight[r0:r1].float(), None if bias is None else bias[r0:r1].float())
        return out

    return forward


class TorchReference(FolderFacts):
    def __init__(self, model_dir: Path) -> None:
        import torch  # noqa: PLC0415 - relctl's [models] extra
        from transformers import AutoModelForCausalLM  # noqa: PLC0415

        self.model_dir = model_dir
        self._torch: Any = torch
        # "auto": the stored dtype (see the module docstring); the computation is fp32 either way.
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="auto")
        widen_while_running(model, torch)
        self._model: Any = model.eval()
        self._tokenizer = load_tokenizer(model_dir / "tokenizer.json")
        self._read_facts(model_dir)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids))

    def logits(self, ids: list[int]) -> np.ndarray:
        with self._torch.no_grad():
            out = self._model(self._torch.tensor([ids]))
        return np.asarray(out.logits[0].float().numpy(), dtype=np.float32)

    def generate_with_logits(self, input_ids: list[int], max_new_tokens: int) -> tuple[list[int], np.ndarray]:
        """Greedy continuation and the teacher-forced logits of prompt + continuation."""
        return self.batch_generate_with_logits([input_ids], max_new_tokens)[0]

    def batch_generate_with_logits(self, prompts: list[list[int]], max_new_tokens: int
                                   ) -> list[tuple[list[int], np.ndarray]]:
        """For each prompt, its greedy continuation and the teacher-forced logits of prompt + continuation,
        BATCH prompts at a time (left-padded, masked): one pass over the weights serves the whole batch, so
        the reference costs a forward per generated token per batch, not per prompt."""
        out: list[tuple[list[int], np.ndarray]] = []
        for start in range(0, len(prompts), BATCH):
            out += self._batch(prompts[start:start + BATCH], max_new_tokens)
        return out

    def _batch(self, prompts: list[list[int]], max_new_tokens: int) -> list[tuple[list[int], np.ndarray]]:
        torch = self._torch
        new = max(0, min(max_new_tokens, self._context - max(len(p) for p in prompts)))
        pad = self._eos[0] if self._eos else 0
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        continuations: list[list[int]] = [[] for _ in prompts]
        if new:
            with torch.no_grad():
                generated = self._model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                                                 do_sample=False, num_beams=1, pad_token_id=pad,
                                                 eos_token_id=self._eos or None)
            for row, tokens in enumerate(generated[:, width:].tolist()):
                for token in tokens:
                    continuations[row].append(int(token))
                    if token in self._eos:
                        break
        results = []
        full = [p + c for p, c in zip(prompts, continuations, strict=True)]
        length = max(len(f) for f in full)
        ids = torch.tensor([[pad] * (length - len(f)) + f for f in full])
        mask = torch.tensor([[0] * (length - len(f)) + [1] * len(f) for f in full])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = self._model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        for row, f in enumerate(full):
            results.append((continuations[row], np.asarray(logits[row, length - len(f):].float().numpy(),
                                                           dtype=np.float32)))
        return results

    def generate_ids(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        generated: list[int] = []
        past, step = None, list(input_ids)
        # transformers 5.25 names the KV cache `cache` (`past_key_values` is deprecated, removed in 5.40);
        # earlier releases only know `past_key_values`.
        name = "cache" if "cache" in inspect.signature(self._model.forward).parameters else "past_key_values"
        while len(generated) < max_new_tokens and len(input_ids) + len(generated) < self._context:
            with self._torch.no_grad():
                out = self._model(self._torch.tensor([step]), use_cache=True, **{name: past})
            past = getattr(out, name)
            token = int(out.logits[0, -1].argmax())
            generated.append(token)
            if token in self._eos:
                break
            step = [token]
        return generated

