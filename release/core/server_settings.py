"""Server settings: limits, admission control, timeouts and the request-log retention policy.

They live in release.yaml under `serving.server` and travel in the package manifest's `serving` block,
so they are covered by the package's serving-config hash that every response names.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RequestLogPolicy(BaseModel):
    """What the server keeps of prompts and outputs. Off by default: nothing is written."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=False, description="write one JSONL line per request")
    # redact: emails, numbers and keys replaced by placeholders; hash: sha256 only; full: verbatim.
    content: Literal["redact", "hash", "full", "none"] = Field(
        default="redact", description="how prompts and outputs are kept: redact, hash, full or none (metadata only)"
    )
    retention_days: int = Field(default=7, ge=1, le=3650, description="log files older than this are deleted")
    directory: str | None = Field(default=None, description="log folder; default: <state dir>/request-logs")


class ServerSettings(BaseModel):
    """Limits and behaviour of `relctl serve`; defaults suit a small model on CPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(default=2, ge=1, le=64, description="generations running at once on the thread-pool path "
                         "(one generator each); with batching, the threads that serve seeded requests; in front of an "
                         "engine that schedules itself, at least as many as it runs at once (its admission_limit)")
    batching: Literal["auto", "on", "off"] = Field(
        default="auto", description="batch requests through the engine's own batching (its runner's "
        "BatchEngine): auto (when the model supports it, else the thread pool), on (refuse to start without "
        "it) or off (thread pool only)")
    max_batch_size: int = Field(default=8, ge=1, le=256, description="requests the batching engine runs at "
                                "once, at most what its scheduler steps together (the runner caps it; /health "
                                "reports the width in use)")
    batch_gather_ms: float = Field(default=5.0, ge=0, le=1000, description="when a batch ends while requests "
                                   "wait, how long to wait for more before the next one starts")
    intra_op_threads: int | None = Field(
        default=None, ge=1, le=256, description="the in-process engine's threads per model step; default: "
        "the engine's own (often one per core, spinning between steps, which starves the server's own "
        "threads on a small machine)")
    queue_size: int = Field(default=16, ge=0, le=10_000, description="requests waiting for a worker; beyond: 429")
    max_prompt_tokens: int = Field(default=1024, ge=1, description="longer prompts are refused with 400")
    max_output_tokens: int = Field(default=512, ge=1, description="max_tokens above this is refused with 400")
    default_max_tokens: int = Field(default=16, ge=1, description="max_tokens when a request gives none")
    max_body_bytes: int = Field(default=1_000_000, ge=1024, description="larger request bodies are refused")
    request_timeout_s: float = Field(default=60.0, gt=0, description="queue wait + generation; then 504")
    shutdown_grace_s: float = Field(default=30.0, ge=0, description="time in-flight requests get to finish on stop")
    request_log: RequestLogPolicy = RequestLogPolicy()

    @model_validator(mode="after")
    def check_defaults(self) -> ServerSettings:
        if self.default_max_tokens > self.max_output_tokens:
            raise ValueError("default_max_tokens must not exceed max_output_tokens")
        return self
