"""The reference near its floor: Llama and Qwen2 decoders computed by hand over the mapped checkpoint.

What the reference stage needs is each prompt's greedy continuation and the logits at every position of
prompt + continuation. The transformers reference (release/backends/torch_reference.py) gets them from a
left-padded `generate` and then a second, teacher-forced pass over prompt + continuation: every weight is
read (and widened) once per generated token and once more for the whole batch, padded rows included.
Here the logits are collected while generating, which is the same numbers (a causal model's logits at a
position depend on the tokens up to it only):
- prefill: all prompts' tokens go through each layer together (their rows concatenated, no padding;
  attention per prompt), each layer's weights read and widened once for all of them; the logits of every
  prompt position are kept;
- each decode step: one row per prompt still running, through each layer once, with a KV cache; the row of
  a prompt whose continuation has ended (EOS or max_new_tokens) runs once more for its last token's logits.
Every product is fp32 (a bf16/fp16 weight widened into a scratch buffer allocated once per shape: the
numbers of an fp32 load, which the transformers reference's are too), the vocabulary projection a slice of
rows at a time. The weights stay where they are: each safetensors file is mapped (copy-on-write, never
written), so the checkpoint is read from disk once when memory allows and its pages stay reclaimable.
Threads: one per CPU this process may run on (`os.sched_getaffinity`) that the load average leaves idle, at
least one (`threads_for_this_machine`): on a shared runner, threads beyond the idle cores wait on each other
at every operation (0.5B, 8 prompts, 3 new tokens at load 5.5 on 2 cores: 41.6 s with 2 threads, 6.0 s with 1).

`supported(config)` says which checkpoints it computes; any other goes to the transformers reference.
tests/backends/test_streamed_reference.py checks its logits against the transformers reference's.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from release.backends.folder_facts import FolderFacts
from release.core.tokenizer_file import load_tokenizer

BATCH = 8  # as the transformers reference: max_new_tokens is capped by the context per group of 8 prompts
VOCAB_ROWS = 8192  # rows of the vocabulary projection widened at a time
BLOCK = 512  # output rows of a layer widened at a time when few token rows go through it
BLOCK_ROWS_UP_TO = 64  # token rows up to which a layer is widened block by block
_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
_FAMILIES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def supported(config: dict[str, Any]) -> str | None:
    """None when this reference computes `config`'s model exactly as transformers does, else why not."""
    family = config.get("model_type")
    if family not in _FAMILIES:
        return f"model_type {family!r} (streamed: {', '.join(_FAMILIES)})"
    # transformers 5 writes the rotary settings as rope_parameters, earlier releases as rope_scaling.
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key) or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default" or rope.get("partial_rotary_factor",
                                                                                        1.0) != 1.0:
            return f"{key} {rope}"
    if any(kind != "full_attention" for kind in config.get("layer_types") or []):
        return "layer_types other than full_attention"
    if config.get("hidden_act", "silu") != "silu":
        return f"hidden_act {config.get('hidden_act')!r}"
    if family == "qwen2" and config.get("use_sliding_window"):
        return "sliding-window attention"
    if family == "llama" and config.get("mlp_bias"):
        return "mlp_bias"
    if config.get("pretraining_tp", 1) not in (1, None):
        return "pretraining_tp"
    return None


def threads_for_this_machine() -> int:
    """The CPUs this process may run on, less those the 1-minute load average keeps busy; at least one."""
    cpus = len(os.sched_getaffinity(0))
    return max(1, min(cpus, round(cpus - os.getloadavg()[0])))


class _Tensors:
    """Every tensor of the folder's safetensors files, mapped (not read) by name."""

    def __init__(self, model_dir: Path, torch: Any) -> None:
        self._torch = torch
        self._maps: list[mmap.mmap] = []
        self.tensors: dict[str, Any] = {}
        for path in sorted(model_dir.glob("*.safetensors")):
            with path.open("rb") as fh:
                (length,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(length))
                # Copy-on-write: torch wants a writable buffer; nothing writes to it, so no page is copied.
                mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
            self._maps.append(mapped)
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                dtype = getattr(torch, _DTYPES[info["dtype"]])
                start, end = info["data_offsets"]
                count = (end - start) // torch.empty((), dtype=dtype).element_size()
                flat = torch.frombuffer(mapped, dtype=dtype, count=count, offset=8 + length + start) if count else \
                    torch.empty(0, dtype=dtype)
                self.tensors[name] = flat.view(info["shape"])

    def get(self, name: str) -> Any:
        return self.tensors[name]

    def has(self, name: str) -> bool:
        return name in self.tensors


class StreamedReference(FolderFacts):
    """greedy continuation + logits of prompt + continuation, one pass over the layers per step."""

    def __init__(self, model_dir: Path) -> None:
        import torch  # noqa: PLC0415 - relctl's [models] extra

        self._torch: Any = torch
        self.threads = threads_for_this_machine()  # set for each computation only, and given back after it
        config = self._read_facts(model_dir)
        why = supported(config)
        if why is not None:
            raise ValueError(f"the streamed reference does not compute this model: {why}")
        self.model_dir = model_dir
        self._tokenizer = load_tokenizer(model_dir / "tokenizer.json")
        self._w = _Tensors(model_dir, torch)
        c = config
        self.hidden = int(c["hidden_size"])
        self.layers = int(c["num_hidden_layers"])
        self.heads = int(c["num_attention_heads"])
        self.kv_heads = int(c.get("num_key_value_heads") or self.heads)
        self.head_dim = int(c.get("head_dim") or self.hidden // self.heads)
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        theta = float((c.get("rope_parameters") or {}).get("rope_theta") or c.get("rope_theta") or 10000.0)
        self._inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim))
        self._scratch: dict[tuple[int, ...], Any] = {}
        needed = ["model.embed_tokens.weight", "model.norm.weight"] + [
            f"model.layers.{layer}.{name}.weight" for layer in range(self.layers)
            for name in ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                         "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
        missing = [name for name in needed if not self._w.has(name)]
        if missing:
            raise ValueError(f"the streamed reference does not compute this model: no {missing[0]}")
        head = "lm_head.weight"
        self._lm_head = self._w.get(head) if self._w.has(head) else self._w.get("model.embed_tokens.weight")

    # -- FolderFacts ---------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids))

    def generate_ids(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        return self.batch_generate_with_logits([input_ids], max_new_tokens)[0][0]

    def logits(self, ids: list[int]) -> np.ndarray:
        return self.batch_generate_with_logits([ids], 0)[0][1]

    def generate_with_logits(self, input_ids: list[int], max_new_tokens: int) -> tuple[list[int], np.ndarray]:
        return self.batch_generate_with_logits([input_ids], max_new_tokens)[0]

    # -- the computation -------------------------------------------------------------------------------------
    def _fp32(self, name: str) -> Any:
        """The weight `name` in fp32: itself when stored so, else widened into a scratch buffer of its shape
        (allocated once: a fresh copy per use costs page faults as large as the widening)."""
        weight = self._w.get(name)
        if weight.dtype == self._torch.float32:
            return weight
        buf = self._scratch.get(tuple(weight.shape))
        if buf is None:
            buf = self._scratch[tuple(weight.shape)] = self._torch.empty(weight.shape, dtype=self._torch.float32)
        return buf.copy_(weight)

    def _linear(self, x: Any, prefix: str) -> Any:
        torch = self._torch
        weight = self._w.get(f"{prefix}.weight")
        if weight.dtype == torch.float32 or x.shape[0] > BLOCK_ROWS_UP_TO:
            out = torch.nn.functional.linear(x, self._fp32(f"{prefix}.weight"))
        else:
            # A few rows (a decode step): widen and multiply BLOCK output rows at a time, so the fp32 copy
            # stays in the cache instead of making a round trip through memory (the same dot products).
            out = x.new_empty(x.shape[0], weight.shape[0])
            buf = self._scratch.get((BLOCK, weight.shape[1]))
            if buf is None:
                buf = self._scratch[(BLOCK, weight.shape[1])] = torch.empty(BLOCK, weight.shape[1])
            for r0 in range(0, weight.shape[0], BLOCK):
                r1 = min(weight.shape[0], r0 + BLOCK)
                out[:, r0:r1] = torch.nn.functional.linear(x, buf[:r1 - r0].copy_(weight[r0:r1]))
        if self._w.has(f"{prefix}.bias"):
            out += self._w.get(f"{prefix}.bias").float()
        return out

    def _norm(self, x: Any, name: str) -> Any:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self._w.get(name).float() * (x * self._torch.rsqrt(variance + self.eps))

    def _angles(self, positions: Any) -> tuple[Any, Any]:
        """cos and sin at `positions` (rows,), as transformers' rotary embedding computes them; once per pass."""
        freqs = positions.float()[:, None] * self._inv_freq[None, :]
        emb = self._torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None, :], emb.sin()[:, None, :]

    def _rope(self, x: Any, angles: tuple[Any, Any]) -> Any:
        """x (rows, heads, head_dim) rotated by `angles`, as transformers' rotate_half does."""
        torch = self._torch
        cos, sin = angles
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _forward(self, tokens: list[list[int]], starts: list[int], cache: list[list[tuple[Any, Any]]]) -> Any:
        """Rows of `tokens[i]` (at positions starts[i]...) for each sequence i, through every layer once;
        appends their keys and values to cache[i][layer]. Returns the fp32 hidden states after the final
        norm, the sequences' rows concatenated."""
        torch = self._torch
        lengths = [len(t) for t in tokens]
        flat = torch.tensor([t for seq in tokens for t in seq], dtype=torch.int64)
        positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lengths, strict=True)])
        x = self._w.get("model.embed_tokens.weight")[flat].float()
        angles = self._angles(positions)
        groups = self.heads // self.kv_heads
        for layer in range(self.layers):
            p = f"model.layers.{layer}"
            h = self._norm(x, f"{p}.input_layernorm.weight")
            q = self._rope(self._linear(h, f"{p}.self_attn.q_proj").view(-1, self.heads, self.head_dim), angles)
            k = self._rope(self._linear(h, f"{p}.self_attn.k_proj").view(-1, self.kv_heads, self.head_dim), angles)
            v = self._linear(h, f"{p}.self_attn.v_proj").view(-1, self.kv_heads, self.head_dim)
            outs = []
            offset = 0
            for i, n in enumerate(lengths):
                ks, vs = k[offset:offset + n], v[offset:offset + n]
                if layer < len(cache[i]):
                    pk, pv = cache[i][layer]
                    ks, vs = torch.cat((pk, ks)), torch.cat((pv, vs))
                    cache[i][layer] = (ks, vs)
                else:
                    cache[i].append((ks, vs))
                qi = q[offset:offset + n].transpose(0, 1)  # (heads, n, d)
                ki = ks.transpose(0, 1).repeat_interleave(groups, dim=0)
                vi = vs.transpose(0, 1).repeat_interleave(groups, dim=0)
                scores = torch.matmul(qi, ki.transpose(1, 2)) * self.head_dim ** -0.5
                past = ks.shape[0] - n
                causal = torch.ones(n, ks.shape[0], dtype=torch.bool).tril(diagonal=past)
                scores = scores.masked_fill(~causal, float("-inf"))
                attn = torch.matmul(torch.softmax(scores, dim=-1), vi)  # (heads, n, d)
                outs.append(attn.transpose(0, 1).reshape(n, self.heads * self.head_dim))
                offset += n
            x = x + self._linear(torch.cat(outs), f"{p}.self_attn.o_proj")
            h = self._norm(x, f"{p}.post_attention_layernorm.weight")
            gate = self._linear(h, f"{p}.mlp.gate_proj")
            up = self._linear(h, f"{p}.mlp.up_proj")
            x = x + self._linear(torch.nn.functional.silu(gate) * up, f"{p}.mlp.down_proj")
        return self._norm(x, "model.norm.weight")

    def _project(self, hidden: Any) -> Any:
        """The vocabulary projection in fp32, VOCAB_ROWS rows of the weight widened at a time."""
        torch = self._torch
        weight = self._lm_head
        out = hidden.new_empty(hidden.shape[0], weight.shape[0])
        for r0 in range(0, weight.shape[0], VOCAB_ROWS):
            r1 = min(weight.shape[0], r0 + VOCAB_ROWS)
            out[:, r0:r1] = torch.nn.functional.linear(hidden, weight[r0:r1].float())
        return out

    def batch_generate_with_logits(self, prompts: list[list[int]], max_new_tokens: int
                                   ) -> list[tuple[list[int], np.ndarray]]:
        """For each prompt its greedy continuation (stopping at EOS, kept) and the logits of prompt +
        continuation, all prompts through each layer together."""
        torch = self._torch
        budgets = []
        for start in range(0, len(prompts), BATCH):  # the transformers reference's cap, group by group
            group = prompts[start:start + BATCH]
            budgets += [max(0, min(max_new_tokens, self._context - max(len(p) for p in group)))] * len(group)
        # torch's thread count is the process's: a reference inside a longer process (promote's later stages,
        # a test session's in-process commands) must not leave every later torch call on its count.
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return self._generate(prompts, budgets)
        finally:
            torch.set_num_threads(before)

    def _generate(self, prompts: list[list[int]], budgets: list[int]) -> list[tuple[list[int], np.ndarray]]:
        torch = self._torch
        cache: list[list[tuple[Any, Any]]] = [[] for _ in prompts]
        continuations: list[list[int]] = [[] for _ in prompts]
        logits: list[list[Any]] = [[] for _ in prompts]
        with torch.no_grad():
            hidden = self._forward(prompts, [0] * len(prompts), cache)
            rows = self._project(hidden)
            offset = 0
            for i, p in enumerate(prompts):
                logits[i].append(rows[offset:offset + len(p)])
                offset += len(p)
            grow: Callable[[int], None] = lambda i: continuations[i].append(int(logits[i][-1][-1].argmax()))  # noqa: E731
            running = [i for i in range(len(prompts)) if budgets[i] > 0]
            for i in running:
                grow(i)
            # Each step: every sequence whose last token has no logits yet, one row each.
            while running:
                tokens = [[continuations[i][-1]] for i in running]
                starts = [len(prompts[i]) + len(continuations[i]) - 1 for i in running]
                rows = self._project(self._forward(tokens, starts, [cache[i] for i in running]))
                still = []
                for row, i in enumerate(running):
                    logits[i].append(rows[row:row + 1])
                    if len(continuations[i]) < budgets[i] and continuations[i][-1] not in self._eos:
                        grow(i)
                        still.append(i)
                running = still
        return [(continuations[i], np.asarray(torch.cat(logits[i]).numpy(), dtype=np.float32))
                for i in range(len(prompts))]


def load_checkpoint_reference(model_dir: Path) -> Any:
    """The streamed reference where it computes the checkpoint's family, else the transformers reference.
    RELCTL_REFERENCE=transformers asks for the latter (a comparison, or a family's doubt)."""
    from release.backends.folder_facts import model_facts  # noqa: PLC0415

    config, _ = model_facts(model_dir)
    if (os.environ.get("RELCTL_REFERENCE") != "transformers" and supported(config) is None
            and any(model_dir.glob("*.safetensors"))
            and not (model_dir / "adapter_config.json").is_file()):
        try:
            return StreamedReference(model_dir)
        except ValueError:  # tensors named otherwise than transformers saves them: transformers reads them
            pass
    from release.backends.torch_reference import TorchReference  # noqa: PLC0415 - loads transformers

    return TorchReference(model_dir)
