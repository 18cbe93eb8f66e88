"""A GGUF package inside `relctl serve`: relctl's server stays the front, llama-server generates behind it.

`open_runner` starts llama-server (the backend's argv) on a private 127.0.0.1 port with one slot per request
relctl admits at once (`serving.server.workers`, raised by relctl's server to at least the backend's
`admission_limit`: llama-server's own default of 4 slots), so llama.cpp's continuous batching sees every
admitted request and relctl's queue never caps it below its own scheduler. relctl keeps request validation, admission
(429), auth, timeouts, stop strings, the X-Relctl-* headers, /metrics and the request log. Prompt ids, not
text, go to llama-server, so relctl's length checks and the engine see the same tokens; the tokenizer is the
engine's own (/tokenize), the one validation checked against the training tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import httpx

from release.backends.forwarding import Chunk, forward
from release.backends.jobs import Job, ModelLimits, sampled
from release.backends.llama_cpp.gguf_facts import GGUF_FILE, GgufFacts, read_gguf
from release.backends.llama_cpp.server import ServerProcess, log_path
from release.backends.processes import free_port

if TYPE_CHECKING:
    from release.backends.llama_cpp import LlamaCppBackend
    from release.core.server_settings import ServerSettings

ENGINE_NAME = "engine"  # the alias llama-server serves under, behind relctl (clients never see it)


class LlamaCppRunner:
    batch = None

    def __init__(self, server: ServerProcess, facts: GgufFacts, slots: int) -> None:
        self.server = server
        self.facts = facts
        self.limits = ModelLimits(vocab_size=facts.vocab_size, context_length=facts.context_length)
        self.eos_ids = frozenset([] if facts.eos_token_id is None else [facts.eos_token_id])
        self.batching_note = (f"llama.cpp batches continuously behind relctl ({slots} slots, one per request relctl "
                              f"admits at once: serving.server.workers; started in {server.start_s:.1f}s)")
        self._http = httpx.Client(base_url=server.url, timeout=None)

    @classmethod
    def start(cls, backend: LlamaCppBackend, model_dir: Path, settings: ServerSettings) -> Self:
        facts = read_gguf(model_dir / GGUF_FILE)
        port = free_port()
        command = backend.engine_command(model_dir, ENGINE_NAME, "127.0.0.1", port, slots=settings.workers)
        server = ServerProcess(command, f"http://127.0.0.1:{port}", log_path("serve", port)).start()
        return cls(server, facts, settings.workers)

    def encode(self, text: str) -> list[int]:
        response = self._http.post("/tokenize", json={"content": text, "add_special": True, "parse_special": True},
                                   timeout=30)
        response.raise_for_status()
        return [int(t) for t in response.json()["tokens"]]

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        if self.facts.chat_template:
            from jinja2 import Template  # noqa: PLC0415 - only chat requests need it

            return str(Template(self.facts.chat_template).render(messages=messages, add_generation_prompt=True))
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"

    def decode_loop(self, job: Job) -> tuple[str, int]:
        params = job.params
        body: dict[str, Any] = {"prompt": job.prompt_ids, "n_predict": params.max_tokens, "stream": True,
                                "cache_prompt": True, "ignore_eos": params.ignore_eos}
        if sampled(params):
            # OpenAI's sampling: temperature, top_p, top_k only (llama.cpp's min_p 0.05 default is off).
            body.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or 0, min_p=0.0)
            if params.seed is not None:
                body["seed"] = params.seed
        else:
            body["temperature"] = 0.0
        return forward(self._http, "/completion", body, job, "llama-server", _chunks)

    def close(self) -> None:
        self._http.close()
        self.server.stop()


def _chunks(event: dict[str, Any]) -> list[Chunk]:
    """One llama-server event: one token's text; the last (`stop`) carries llama.cpp's own count and reason."""
    if not event.get("stop"):
        return [Chunk(text=event.get("content") or "", token=True)]
    finish = "stop" if event.get("stop_type") in ("eos", "word") else "length"
    count = event.get("tokens_predicted")
    return [Chunk(text=event.get("content") or "", token=True, finish=finish,
                  count=None if count is None else int(count), last=True)]
