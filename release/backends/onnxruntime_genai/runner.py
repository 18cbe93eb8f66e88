"""The onnxruntime-genai model inside relctl's server: its tokenizer, chat template, limits, the batching
engine (og.Engine on one driver thread, release/backends/onnxruntime_genai/batching.py) and the token loop
the thread pool runs for requests the batch cannot take (batching off, a `seed`, `logprobs`, an unbatchable
model)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from release.backends.jobs import Job, ModelLimits, StopMatcher, emit_text, sampled
from release.backends.logprobs import score_prompt, score_token
from release.backends.onnxruntime_genai.batching import BatchEngine
from release.backends.onnxruntime_genai.model import kv_floor, open_tokenizer, read_genai_config
from release.core.errors import InputError
from release.core.server_settings import ServerSettings
from release.core.tokenizer_file import load_tokenizer

log = logging.getLogger("relctl.serve")

FALLBACK_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


class GenaiRunner:
    """A loaded genai model folder, as relctl's server drives it (release.backends.base.Runner)."""

    def __init__(self, model_dir: Path, settings: ServerSettings) -> None:
        import onnxruntime_genai as og  # noqa: PLC0415 - loaded with a model, not by `relctl bench`

        self._og = og
        self.settings = settings
        runtime = read_genai_config(model_dir)
        context_length = int(runtime["model"]["context_length"])
        self.kv_floor = kv_floor(runtime)
        self.limits = ModelLimits(vocab_size=int(runtime["model"]["vocab_size"]), context_length=context_length)
        config = og.Config(str(model_dir))
        if settings.batching != "off":
            config.overlay(json.dumps({"engine": {"static_batching": {"max_batch_size": settings.max_batch_size}}}))
        if settings.intra_op_threads is not None:
            config.overlay(json.dumps({"model": {"decoder": {"session_options": {
                "intra_op_num_threads": settings.intra_op_threads}}}}))
        self.model = og.Model(config)
        # Like training: onnxruntime-genai leaves out BOS unless special tokens are switched on.
        self.tokenizer = open_tokenizer(self.model)
        self.eos_ids = frozenset(int(t) for t in self.tokenizer.eos_token_ids)
        self.batch, self.batching_note = self._start_batching(model_dir)
        self.chat_template = read_chat_template(model_dir)
        names = model_dir / "tokenizer.json"
        self._token_names: Any = load_tokenizer(names) if names.is_file() else None

    def _start_batching(self, model_dir: Path) -> tuple[BatchEngine | None, str]:
        mode = self.settings.batching
        if mode == "off":
            return None, "off (serving.server.batching)"
        try:
            batch = BatchEngine(self._og, self.model, self.tokenizer, self.eos_ids, self.settings.max_batch_size,
                                gather_s=self.settings.batch_gather_ms / 1e3)
        except Exception as exc:  # the Engine refuses models it cannot schedule (model-managed KV cache...)
            if mode == "on":
                raise InputError(f"{model_dir.parent.name}: batching is on, but onnxruntime-genai's Engine cannot "
                                 f"serve this model: {exc}", hint="set serving.server.batching to auto or off") from exc
            log.info("batching unavailable, serving with %d generator threads: %s", self.settings.workers, exc)
            return None, f"unavailable: {exc}"
        if batch.max_batch_size < batch.requested_batch_size:
            note = (f"on, {batch.max_batch_size} requests per step (onnxruntime-genai's scheduler, measured at "
                    f"load; serving.server.max_batch_size is {batch.requested_batch_size})")
            log.info("batching %s", note)
            return batch, note
        return batch, "on"

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text)]

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        rendered: str = self.tokenizer.apply_chat_template(
            json.dumps(messages), template_str=self.chat_template, add_generation_prompt=True
        )
        return rendered

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(np.asarray(ids, dtype=np.int32)))

    def token_texts(self, ids: list[int]) -> list[str]:
        # onnxruntime-genai decodes a special token to U+FFFD; tokenizer.json names it ("<s>"), as vLLM shows it.
        if self._token_names is None:
            return [self.decode([i]) for i in ids]
        return [str(self._token_names.decode([i], skip_special_tokens=False)) for i in ids]

    def decode_loop(self, job: Job) -> tuple[str, int]:
        params = job.params
        generator = self._generator(job)
        generator.append_tokens(job.prompt_ids)
        top = params.logprobs or 0
        if params.scored and params.echo:
            # append_tokens ran the prompt: the logits output holds one row per prompt token.
            rows = np.asarray(generator.get_output("logits"), dtype=np.float32)[0, -len(job.prompt_ids):]
            job.prompt_scores = score_prompt(rows, job.prompt_ids, top)
        stream = self.tokenizer.create_stream()
        stops = StopMatcher(params.stop)
        count = 0
        while not generator.is_done() and count < params.max_tokens:
            if job.cancel.is_set() or time.monotonic() >= job.deadline:
                return "timeout", count
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            if params.scored:
                # The model runs again only at the next generate_next_token: the logits output is still the
                # row this token was chosen from (raw model output: before temperature, top-k and top-p).
                # An EOS is scored too, as OpenAI-compatible servers list it (lm-eval drops the last entry).
                row = np.asarray(generator.get_output("logits"), dtype=np.float32)[0, -1]
                job.output_scores.append(score_token(row, token, top))
            if token in self.eos_ids and not params.ignore_eos:
                emit_text(job, stops.flush())
                return "stop", count
            count += 1
            text, stopped = stops.feed(stream.decode(token))
            emit_text(job, text)
            if stopped:
                return "stop", count
        emit_text(job, stops.flush())
        return "length", count

    def _generator(self, job: Job) -> Any:
        """The job's generator (GenaiAdapterRunner sets the job's adapter active on it)."""
        return self._og.Generator(self.model, self._search_params(job))

    def _search_params(self, job: Job) -> Any:
        params = job.params
        wanted = len(job.prompt_ids) + params.max_tokens
        # A sliding-window model needs a KV capacity of at least its window; the loop stops at max_tokens.
        options: dict[str, Any] = {"max_length": min(max(wanted, self.kv_floor), self.limits.context_length)}
        if params.ignore_eos:
            options["min_length"] = wanted
        if sampled(params):
            options.update(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)
            if params.seed is not None:
                options["random_seed"] = params.seed
        else:
            options["do_sample"] = False
        search = self._og.GeneratorParams(self.model)
        search.set_search_options(**options)
        return search

    def close(self) -> None:
        if self.batch is not None:
            self.batch.close()


def read_chat_template(model_dir: Path) -> str:
    """The tokenizer's chat template, or a plain `role: content` one for models that have none."""
    path = model_dir / "tokenizer_config.json"
    from release.core.jsonfile import load_json_object, optional  # noqa: PLC0415

    label, hint = f"{model_dir.name}/tokenizer_config.json", "save the tokenizer with tokenizer.save_pretrained(dir)"
    template = optional(load_json_object(path, hint, label, missing_ok=True), "chat_template", str, label, hint)
    if template:
        return str(template)
    return FALLBACK_CHAT_TEMPLATE
