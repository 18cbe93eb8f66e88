"""An fp16 genai model folder run on ONNX Runtime's CPU kernels without an fp32 copy of its weights.

onnxruntime-genai's builder writes fp16 for CUDA; validation and the offline gates run it on the CPU
execution provider, which has no fp16 MatMul on x86 and puts a Cast to fp32 in front of each one. Loaded
the usual way (og.Model, default session options) the graph optimiser folds every Cast of a weight into
a new fp32 initializer: the session holds the fp16 weights and an fp32 copy of all of them, 2.9x the
checkpoint at Qwen2.5-0.5B (0.99 GB of fp16 weights, 2.89 GB resident after load). With the optimiser off
the Casts run at each forward instead, but ONNX Runtime's default execution order runs every Cast first
(they depend only on initializers), so all the fp32 copies are alive together (1.87 GB anonymous at 0.5B).

Here the session runs with graph optimisations off and ONNX Runtime's priority-based execution order, which
runs each Cast just before the MatMul that reads it: one weight's fp32 copy exists at a time (the largest,
the vocabulary projection, 0.54 GB at 0.5B), the fp16 weights stay in the mapped external-data file, and the
resident set of a 0.5B forward falls from 2.9 GB to 1.65 GB (1.03 GB of it the mapped weights). The cost is
a widening of every weight at every forward, so generation runs all prompts as one ragged batch (right
padded, the KV buffer shared between past and present as onnxruntime-genai's own decoder runs it): one
forward per new token for all of them. It is the graph og.Model runs on the CPU provider, without the
optimiser's fusions: logits equal up to fp16 rounding and the same greedy tokens prompt by prompt
(tests/stages/test_validate.py).

Used for fp16 folders without sliding-window layers on the CPU provider (GenaiModel otherwise); the
tokenizer is onnxruntime-genai's own, read from the folder without loading the weights.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from release.backends.base import Generation
from release.backends.onnxruntime_genai.model import MODEL_FILE, GenaiTokens, open_tokenizer, read_genai_config
from release.core.errors import InputError

_FLOAT16 = 10  # onnx.TensorProto.FLOAT16


def runs_lean(model_dir: Path, execution_provider: str) -> bool:
    """True for a folder this module runs: the CPU provider, fp16 past-KV inputs (the builder's fp16 graph)
    and no bounded sliding-window cache (whose layers take a fixed-capacity past this batch does not lay out)."""
    if execution_provider != "cpu" or not (model_dir / MODEL_FILE).is_file():
        return False
    decoder = read_genai_config(model_dir)["model"]["decoder"]
    if (decoder.get("sliding_window") or {}).get("layers"):
        return False
    graph = onnx.load(str(model_dir / MODEL_FILE), load_external_data=False).graph
    return any(i.name.startswith("past_key_values.") and i.type.tensor_type.elem_type == _FLOAT16
               for i in graph.input)


class LeanCpuModel(GenaiTokens):
    """release.backends.base.LoadedModel over one low-memory onnxruntime session (see the module docstring)."""

    def __init__(self, model_dir: Path) -> None:
        import onnxruntime as ort  # noqa: PLC0415 - native libraries; only when a model is loaded
        import onnxruntime_genai as og  # noqa: PLC0415

        self.model_dir = model_dir
        self._config = read_genai_config(model_dir)
        self._tokenizer = open_tokenizer(og.Config(str(model_dir)))  # the served tokenizer, no weights
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # No optimiser: it would fold each weight's Cast into an fp32 initializer (a copy of every weight).
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        # Each Cast just before its consumer, not all first: one weight's fp32 copy alive at a time.
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        # Freed copies go back to the system rather than into an arena sized for the largest moment.
        options.enable_cpu_mem_arena = False
        self._session = ort.InferenceSession(str(model_dir / MODEL_FILE), options,
                                             providers=["CPUExecutionProvider"])
        self._past = [i.name for i in self._session.get_inputs() if i.name.startswith("past_key_values.")]
        decoder = self._config["model"]["decoder"]
        self._kv_shape = (int(decoder.get("num_key_value_heads", decoder["num_attention_heads"])),
                          int(decoder["head_size"]))
        self._lock = threading.Lock()

    @property
    def context_length(self) -> int:
        return int(self._config["model"].get("context_length", 0)) or 2048

    def logits(self, ids: list[int]) -> np.ndarray:
        """Teacher-forced logits for `ids`, (len(ids), vocab), float32: one forward with an empty past."""
        if not ids:
            raise InputError("logits: no token ids given", hint="pass at least one token id")
        if len(ids) > self.context_length:
            raise InputError(f"logits: {len(ids)} tokens, the model's context is {self.context_length}",
                             hint="shorten the sequence")
        heads, head_size = self._kv_shape
        feeds: dict[str, np.ndarray] = {"input_ids": np.asarray([ids], dtype=np.int64),
                                        "attention_mask": np.ones((1, len(ids)), dtype=np.int64)}
        for name in self._past:
            feeds[name] = np.zeros((1, heads, 0, head_size), dtype=np.float16)
        with self._lock:
            (logits,) = self._session.run(["logits"], feeds)
        return np.asarray(logits[0], dtype=np.float32)

    def generate(self, prompt: str, max_new_tokens: int) -> Generation:
        ids = self.encode(prompt)
        generated = self.generate_batch([ids], max_new_tokens)[0]
        finish = "stop" if generated and generated[-1] in self.eos_token_ids else "length"
        return Generation(text=self.decode(generated), token_ids=generated, prompt_tokens=len(ids),
                          finish_reason=finish)

    def generate_ids(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        return self.generate_batch([list(input_ids)], max_new_tokens)[0]

    def generate_batch(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Greedy continuations of every prompt (EOS included when hit, as GenaiModel's), one forward per
        new token for the whole batch: the prompts right-padded in one buffer per layer, each row's own
        length told to GroupQueryAttention by its attention mask's sum."""
        if not prompts or any(not p for p in prompts):
            raise InputError("prompt: tokenizes to no tokens", hint="give a non-empty prompt")
        if max_new_tokens < 1:
            raise InputError(f"max_new_tokens: {max_new_tokens} is below 1", hint="ask for at least one token")
        import onnxruntime as ort  # noqa: PLC0415

        longest = max(len(p) for p in prompts)
        if longest >= self.context_length:
            raise InputError(f"prompt: {longest} tokens, the model's context is {self.context_length}",
                             hint="shorten the prompt")
        steps = min(max_new_tokens, self.context_length - longest)
        batch, heads, head_size = len(prompts), *self._kv_shape
        capacity = longest + steps
        buffers = {name: ort.OrtValue.ortvalue_from_numpy(np.zeros((batch, heads, capacity, head_size), np.float16))
                   for name in self._past}
        ids = np.asarray([p + [0] * (longest - len(p)) for p in prompts], dtype=np.int64)
        mask = np.asarray([[1] * len(p) + [0] * (longest - len(p)) for p in prompts], dtype=np.int64)
        last = np.asarray([len(p) - 1 for p in prompts])  # the position whose logits give each next token
        out: list[list[int]] = [[] for _ in prompts]
        done = [False] * batch
        eos = set(self.eos_token_ids)
        for _ in range(steps):
            binding = self._session.io_binding()
            binding.bind_cpu_input("input_ids", ids)
            binding.bind_cpu_input("attention_mask", mask)
            binding.bind_output("logits")
            for name, value in buffers.items():  # past and present are one buffer, written in place
                binding.bind_ortvalue_input(name, value)
                binding.bind_ortvalue_output(name.replace("past_key_values", "present"), value)
            with self._lock:
                self._session.run_with_iobinding(binding)
            logits: Any = binding.get_outputs()[0].numpy()
            chosen = logits[np.arange(batch), last].argmax(-1)
            for row, token in enumerate(chosen.tolist()):
                if not done[row]:
                    out[row].append(int(token))
                    done[row] = int(token) in eos
            if all(done):
                break
            ids = chosen.astype(np.int64)[:, None]
            mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
            last = np.zeros(batch, dtype=np.int64)
        return out
