"""A third backend, outside relctl: the merged checkpoint served as it is, by PyTorch eager (transformers).

It exists to prove the seam: everything relctl needs from an engine comes through the Backend contract,
so this one module plus one entry point releases the example end to end (validated against the fp32
reference, gated, registered, served by `relctl serve`, traced) without a line of relctl changing.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np

from release.backends.base import Backend, Deploy, ExportResult, Generation, MemoryFacts, Support
from release.backends.jobs import Job, ModelLimits, StopMatcher, emit_text, sampled
from release.backends.package_facts import read_package
from release.backends.planning import MIB, EnginePlan, Target, hidden_activation_bytes, sized_per_load_plan
from release.backends.shape import shape_from_config
from release.core.errors import InputError
from release.core.server_settings import ServerSettings

FAMILIES = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"})
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class TorchEagerBackend(Backend):
    id = "torch-eager"
    distribution = "relctl-toy-backend"
    precisions = ("fp32",)
    execution_providers = ("cpu",)
    runtime_files = ("config.json", "model.safetensors", "tokenizer.json")
    families = "Llama, Mistral, Qwen2 (transformers, fp32, CPU)"

    def supports(self, config: dict[str, Any]) -> Support:
        arch = (config.get("architectures") or ["?"])[0]
        if arch not in FAMILIES:
            return Support.no(str(arch), f"{arch} is not one of {', '.join(sorted(FAMILIES))}")
        return Support.yes(str(arch))

    def export(self, checkpoint: Path, out: Path, precision: str, execution_provider: str,
               log_path: Path) -> ExportResult:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
        model.save_pretrained(str(out), safe_serialization=True, max_shard_size="100GB")
        for name in (*TOKENIZER_FILES, "generation_config.json"):
            if (checkpoint / name).is_file():
                shutil.copy2(checkpoint / name, out / name)
        log_path.write_text(f"saved {checkpoint} at fp32 with transformers {transformers.__version__}\n")
        return ExportResult(versions={"torch": torch.__version__, "transformers": transformers.__version__})

    def load(self, model_dir: Path, execution_provider: str = "cpu") -> EagerModel:
        return EagerModel(model_dir)

    def memory_facts(self, model_dir: Path, declared_precision: str | None) -> MemoryFacts:
        weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
        return MemoryFacts(weights_bytes=weights, kv_dtype_bytes=4, precision="fp32", provider="cpu")

    def plan(self, source: Path, target: Target, precision: str | None = None,
             settings: dict[str, Any] | None = None, measure: bool = False,
             overlap_bytes: int | None = None) -> EnginePlan:
        """transformers' dynamic cache grows with the context (sized per load), fp32 activations of a full
        prefill, and the Python + torch process (a stated 300 MiB)."""
        if not source.is_dir() or settings:
            raise InputError(f"{source}: the torch-eager plan reads a built package and takes no options",
                             hint="plan a package folder")
        facts = read_package(source)
        shape = shape_from_config(facts.config)
        return sized_per_load_plan(self.id, shape, "fp32", facts.weights_bytes, 4, target, 300 * MIB,
                                   lambda batch, context: hidden_activation_bytes(shape, batch * context, 4),
                                   overlap_bytes)

    def open_runner(self, model_dir: Path, settings: ServerSettings) -> EagerRunner:
        return EagerRunner(EagerModel(model_dir))

    def deploy(self) -> Deploy:
        return Deploy(image="relctl-serve-torch", dockerfile="Dockerfile", requirements=("torch", "transformers"))


class EagerModel:
    """The checkpoint in transformers, with the training tokenizer (BOS from its post-processor)."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from tokenizers import Tokenizer
        from transformers import AutoModelForCausalLM

        self.model_dir = model_dir
        self._torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        config = json.loads((model_dir / "config.json").read_text())
        generation = model_dir / "generation_config.json"
        eos = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
        eos = config.get("eos_token_id") if eos is None else eos
        self._eos = [int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else [])]
        self._context = int(config.get("max_position_embeddings", 2048))
        self.vocab_size = int(config["vocab_size"])
        self.lock = threading.Lock()

    @property
    def context_length(self) -> int:
        return self._context

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self._eos)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))

    def logits(self, ids: list[int]) -> np.ndarray:
        with self._torch.no_grad():
            out = self.model(self._torch.tensor([ids]))
        return np.asarray(out.logits[0].float().numpy(), dtype=np.float32)

    def next_logits(self, ids: list[int], past: Any) -> tuple[Any, Any]:
        """Logits of the next token after `ids` (only the new ids when `past` holds the earlier ones)."""
        with self._torch.no_grad():
            out = self.model(self._torch.tensor([ids]), past_key_values=past, use_cache=True)
        return out.logits[0, -1], out.past_key_values

    def generate_ids(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        generated: list[int] = []
        step, past = list(input_ids), None
        while len(generated) < max_new_tokens and len(input_ids) + len(generated) < self._context:
            logits, past = self.next_logits(step, past)
            token = int(logits.argmax())
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


class EagerRunner:
    """relctl's server drives this: one token at a time on its pool threads; no batching engine."""

    batch = None
    batching_note = "off (the torch-eager backend has no batching engine)"

    def __init__(self, model: EagerModel) -> None:
        self.model = model
        self.limits = ModelLimits(vocab_size=model.vocab_size, context_length=model.context_length)
        self.eos_ids = frozenset(model.eos_token_ids)

    def encode(self, text: str) -> list[int]:
        return self.model.encode(text)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"

    def decode_loop(self, job: Job) -> tuple[str, int]:
        import time

        torch = self.model._torch
        params = job.params
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        stops = StopMatcher(params.stop)
        generated: list[int] = []
        shown = ""
        step, past = list(job.prompt_ids), None
        while len(generated) < params.max_tokens:
            if job.cancel.is_set() or time.monotonic() >= job.deadline:
                return "timeout", len(generated)
            logits, past = self.model.next_logits(step, past)
            token = self._pick(logits, job, generator)
            if token in self.eos_ids and not params.ignore_eos:
                emit_text(job, stops.flush())
                return "stop", len(generated)
            generated.append(token)
            # Special tokens stay in the stream (as onnxruntime-genai's does): with ignore_eos, an EOS is
            # still a token the client must see.
            text = str(self.model.tokenizer.decode(generated, skip_special_tokens=False))
            piece, shown = text[len(shown):], text
            out, stopped = stops.feed(piece)
            emit_text(job, out)
            if stopped:
                return "stop", len(generated)
            step = [token]
        emit_text(job, stops.flush())
        return "length", len(generated)

    def _pick(self, logits: Any, job: Job, generator: Any) -> int:
        params = job.params
        if not sampled(params):
            return int(logits.argmax())
        torch = self.model._torch
        scaled = logits / max(params.temperature, 1e-6)
        if params.top_k:
            kth = torch.topk(scaled, min(params.top_k, scaled.numel())).values[-1]
            scaled = torch.where(scaled < kth, torch.full_like(scaled, -float("inf")), scaled)
        return int(torch.multinomial(torch.softmax(scaled, -1), 1, generator=generator))

    def close(self) -> None:
        return None
