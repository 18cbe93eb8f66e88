"""OpenAI request schemas and response bodies.

Unknown fields are ignored (clients send many optional ones) but every field the server uses is type
checked strictly: "5" is not an integer. Any problem becomes a 400 whose `param` names the field.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from release.backends.jobs import GenerationParams, ModelLimits, TokenScore
from release.core.server_settings import ServerSettings

INT32_MAX = 2**31 - 1
# The most alternatives per token `logprobs` may ask for (a common engine default; OpenAI's limit is 5).
MAX_LOGPROBS = 20
# Every token is matched against every stop string: their length bounds the work per token.
MAX_STOP_CHARS = 256


class RequestProblem(Exception):
    """A request the server refuses; `param` is the offending field (OpenAI's error shape)."""

    def __init__(self, param: str, message: str, status: int = 400) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message
        self.status = status

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.status}}


class _Schema(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class StreamOptions(_Schema):
    include_usage: bool = False


class SamplingFields(_Schema):
    model: str | None = None
    max_tokens: int | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    # engines take both as 32-bit signed integers; top_k is also capped by the vocabulary.
    top_k: int = Field(default=0, ge=0, le=INT32_MAX)
    seed: int | None = Field(default=None, ge=0, le=INT32_MAX)
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    # the ignore_eos extension of OpenAI-compatible engine servers: generate exactly max_tokens, as load tests
    # need controlled output lengths.
    ignore_eos: bool = False


class CompletionRequest(SamplingFields):
    # Text, or token ids (as lm-eval's local-completions sends them): one prompt per request either way.
    prompt: str | list[str] | list[int] | list[list[int]]
    # Top-k alternatives per token with each token's log-probability (None: none); `echo`: the prompt is
    # returned before the completion, and with `logprobs` its tokens are scored too.
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False


class TextPart(_Schema):
    type: Literal["text"]
    text: str


class ChatMessage(_Schema):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None


def check_params(req: SamplingFields, settings: ServerSettings, limits: ModelLimits) -> GenerationParams:
    """Apply the server's and the model's limits; max_completion_tokens (chat) wins over max_tokens like
    OpenAI's. Everything the generation thread would refuse is refused here, as a 400 naming the field."""
    field, requested = "max_tokens", req.max_tokens
    if isinstance(req, ChatRequest) and req.max_completion_tokens is not None:
        field, requested = "max_completion_tokens", req.max_completion_tokens
    max_tokens = settings.default_max_tokens if requested is None else requested
    if max_tokens < 1:
        raise RequestProblem(field, "must be at least 1")
    if max_tokens > settings.max_output_tokens:
        raise RequestProblem(field, f"{max_tokens} exceeds this server's limit of {settings.max_output_tokens}")
    if max_tokens >= limits.context_length:
        raise RequestProblem(field, f"{max_tokens} leaves no room for a prompt in the model's context of "
                                    f"{limits.context_length} tokens")
    if req.top_k > limits.vocab_size:
        raise RequestProblem("top_k", f"{req.top_k} exceeds the model's vocabulary of {limits.vocab_size} tokens")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if len(stop) > 4 or any(not s or len(s) > MAX_STOP_CHARS for s in stop):
        raise RequestProblem("stop", f"at most 4 non-empty strings of at most {MAX_STOP_CHARS} characters")
    return GenerationParams(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        stop=stop,
        ignore_eos=req.ignore_eos,
        logprobs=req.logprobs if isinstance(req, CompletionRequest) else None,
        echo=req.echo if isinstance(req, CompletionRequest) else False,
    )


def completion_prompt(req: CompletionRequest) -> str | list[int]:
    """The one prompt of a completion request: its text, or its token ids."""
    prompt = req.prompt
    if isinstance(prompt, str):
        return prompt
    if prompt and all(isinstance(p, int) for p in prompt):
        return [int(p) for p in prompt]  # type: ignore[arg-type]  # list[int], checked just above
    if len(prompt) != 1:
        raise RequestProblem("prompt", "exactly one prompt per request")
    only = prompt[0]
    return only if isinstance(only, str) else list(only)  # type: ignore[arg-type]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": prompt_tokens + output_tokens,
    }


def completion_body(rid: str, model: str, text: str, finish: str | None, chat: bool) -> dict[str, Any]:
    """A whole (non-streamed) response; `usage` is added by the caller."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
        choice["logprobs"] = None
    obj = "chat.completion" if chat else "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}


def logprobs_body(scores: list[TokenScore], texts: list[str], tops: list[dict[str, float] | None],
                  start: int = 0) -> dict[str, Any]:
    """OpenAI's `choices[].logprobs` for consecutive tokens: their texts, log-probabilities (None for a prompt's
    first token), top alternatives (token text -> log-probability) and character offsets from `start`."""
    offsets, at = [], start
    for text in texts:
        offsets.append(at)
        at += len(text)
    return {"tokens": texts, "token_logprobs": [s.logprob for s in scores], "top_logprobs": tops,
            "text_offset": offsets}


def listed_tokens(ids: Sequence[int], eos_ids: Collection[int], text: str, reason: str,
                  decode: Callable[[list[int]], str]) -> int:
    """How many of the generated tokens `ids` a scored answer lists (docs/harness.md): all of them, a final EOS
    included, unless a stop string cut the text; then each token whose text starts within the returned `text`.

    Where a token starts is read from the tokenizer's own decoding of the tokens before it, never by adding up
    each token's own text: a byte-level piece of a character, or a word piece whose leading space only shows
    in context, has another length alone (sampled answers are full of them: the sum ran past the text, and
    the tokens after, EOS included, went missing)."""
    if reason != "stop" or not ids or ids[-1] in eos_ids:
        return len(ids)   # EOS or max_tokens ended it: nothing was cut
    low, high = 0, len(ids)   # tokens start at non-decreasing offsets: the first one starting at or past the end
    while low < high:
        mid = (low + high) // 2
        # A prefix ending inside a character decodes its partial bytes as U+FFFD: that character starts earlier.
        if len(decode(list(ids[:mid])).rstrip("\ufffd")) < len(text):
            low = mid + 1
        else:
            high = mid
    return low


def chunk_body(rid: str, model: str, text: str | None, finish: str | None, chat: bool, first: bool) -> dict[str, Any]:
    """One streamed chunk; chat chunks carry a delta, the first one with the role."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        delta: dict[str, str] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
        choice["logprobs"] = None
    obj = "chat.completion.chunk" if chat else "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}


class ChunkFormat:
    """Streamed text chunks of one response, framed from a template made once (only the text is encoded
    per token): byte for byte what `sse(chunk_body(...))` gives for a chunk that is not the first."""

    _MARK = "\x00"

    def __init__(self, rid: str, model: str, chat: bool) -> None:
        template = json.dumps(chunk_body(rid, model, self._MARK, None, chat, False), separators=(",", ":"))
        prefix, suffix = template.split(json.dumps(self._MARK))
        self.prefix = f"data: {prefix}".encode()
        self.suffix = f"{suffix}\n\n".encode()

    def text(self, piece: str) -> bytes:
        return self.prefix + json.dumps(piece).encode() + self.suffix


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
