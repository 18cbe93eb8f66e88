"""A vLLM package inside `relctl serve`: relctl's server stays the front and vLLM generates behind it.

`open_runner` starts vLLM (the backend's server_command) on a private 127.0.0.1 port; relctl's app keeps
everything a response owes its caller and the release: request validation against the package's limits,
admission (429), auth, timeouts, stop strings, the X-Relctl-* identity headers, /metrics and the request
log. Each admitted request's prompt ids are streamed through vLLM's /v1/completions (vLLM batches the
requests in flight continuously); relctl's thread pool admits as many at once as vLLM schedules itself
(VllmBackend.admission_limit: its max_num_seqs), or `serving.server.workers` when that is larger.
Prompt ids, not text, go to vLLM, so relctl's length checks and vLLM see the same tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import httpx

from release.backends.folder_facts import model_facts
from release.backends.forwarding import Chunk, forward
from release.backends.jobs import Job, ModelLimits, sampled
from release.backends.processes import free_port
from release.backends.vllm import adapters as lora
from release.backends.vllm.engine import EngineProcess, log_path
from release.core.jsonfile import load_json_object, optional
from release.core.tokenizer_file import load_tokenizer

if TYPE_CHECKING:
    from release.backends.vllm import VllmBackend
    from release.core.server_settings import ServerSettings

ENGINE_NAME = "engine"  # the model name vLLM serves under, behind relctl (clients never see it)


class VllmRunner:
    batch = None

    def __init__(self, model_dir: Path, engine: EngineProcess, settings: ServerSettings) -> None:
        config, eos = model_facts(model_dir)
        self.engine = engine
        self.limits = ModelLimits(vocab_size=int(config["vocab_size"]),
                                  context_length=int(config.get("max_position_embeddings", 2048)))
        self.eos_ids = frozenset(eos)
        self.batching_note = (f"vLLM batches continuously behind relctl (started in {engine.start_s:.0f}s); relctl "
                              f"admits {settings.workers} requests at once (vLLM's max_num_seqs, or "
                              "serving.server.workers)")
        self.tokenizer = load_tokenizer(model_dir / "tokenizer.json")
        template = model_dir / "chat_template.jinja"
        tokenizer_config = model_dir / "tokenizer_config.json"
        self.chat_template: str | None = template.read_text() if template.is_file() else None
        if self.chat_template is None and tokenizer_config.is_file():
            label, hint = f"{model_dir.name}/tokenizer_config.json", "save the tokenizer with save_pretrained(dir)"
            self.chat_template = optional(load_json_object(tokenizer_config, hint, label), "chat_template", str,
                                          label, hint)
        # One connection per admitted request: httpx's default pool (100) would queue requests vLLM could run.
        pool = httpx.Limits(max_connections=settings.workers, max_keepalive_connections=settings.workers)
        self._http = httpx.Client(base_url=engine.url, timeout=None, limits=pool)

    @classmethod
    def start(cls, backend: VllmBackend, model_dir: Path, settings: ServerSettings,
              adapters: Mapping[str, Path] | None = None) -> Self:
        """vLLM behind relctl; with `adapters` (engine name: folder, may be empty) LoRA serving is on."""
        port = free_port()
        command = backend.server_command(model_dir, ENGINE_NAME, "127.0.0.1", port, settings)
        if adapters is not None:
            command = lora.with_lora(command, adapters)
        engine = EngineProcess(command, f"http://127.0.0.1:{port}", log_path("serve", port)).start()
        return cls(model_dir, engine, settings)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text).ids)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        if self.chat_template:
            from jinja2 import Template  # noqa: PLC0415 - only chat requests need it

            return str(Template(self.chat_template).render(messages=messages, add_generation_prompt=True))
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"

    def decode_loop(self, job: Job) -> tuple[str, int]:
        params = job.params
        body: dict[str, Any] = {
            "model": job.adapter or ENGINE_NAME, "prompt": job.prompt_ids, "max_tokens": params.max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": params.ignore_eos,
            "skip_special_tokens": False,
        }
        if sampled(params):
            body.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or -1)
            if params.seed is not None:
                body["seed"] = params.seed
        else:
            body["temperature"] = 0.0
        return forward(self._http, "/v1/completions", body, job, "vLLM", _chunks)

    def load_adapter(self, name: str, folder: Path) -> None:
        lora.load(self._http, name, folder)

    def unload_adapter(self, name: str) -> None:
        lora.unload(self._http, name)

    def close(self) -> None:
        self._http.close()
        self.engine.stop()


def _chunks(event: dict[str, Any]) -> list[Chunk]:
    """One vLLM event: a token's text per choice (one choice here), or the final usage with vLLM's own count."""
    if event.get("usage"):
        return [Chunk(count=int(event["usage"]["completion_tokens"]))]
    return [Chunk(text=choice.get("text") or "", token=True, finish=_finish(choice.get("finish_reason")))
            for choice in event.get("choices") or []]


def _finish(reason: str | None) -> str | None:
    """relctl's reason for vLLM's: "stop" (EOS or a stop token) or "length" (anything else that ended it)."""
    return None if not reason else "stop" if reason == "stop" else "length"
