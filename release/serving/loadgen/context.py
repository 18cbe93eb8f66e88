"""What the endpoint says about itself (/v1/models), and fitting requests into its context window.

The client has no tokenizer of the served model, so lengths are bounded, not counted: a synthetic
prompt of plain ASCII words has at most as many tokens as characters under any byte-level or
character tokenizer, and a text row has at least one token per 8 bytes under any common LLM vocabulary.
Rows whose length is given in tokens (public traces, request logs) are checked exactly.
"""

from __future__ import annotations

import http.client
import json
import math
import urllib.error
import urllib.request
from dataclasses import dataclass

from release.core.errors import InputError
from release.serving.loadgen.dataset import Sample

# Tokens the server adds around a prompt: BOS/EOS for completions; a chat template's role markers.
PROMPT_MARGIN = {"completions": 4, "chat": 32}
MAX_BYTES_PER_TOKEN = 8


@dataclass(frozen=True)
class EndpointInfo:
    """The first model an endpoint lists: its id and, when reported, its context length in tokens."""

    model: str | None
    max_model_len: int | None


def models_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return (base if base.endswith("/v1") else base + "/v1") + "/models"


def discover(base_url: str, timeout_s: float = 10.0) -> EndpointInfo:
    """GET /v1/models: the first model's id and `max_model_len` (engine servers and relctl serve report it)."""
    # urllib, not httpx: importing httpx and building its TLS context cost `relctl bench` ~0.25 s of CPU
    # before its first request, for one GET.
    try:
        with urllib.request.urlopen(models_url(base_url), timeout=timeout_s) as resp:
            data = json.loads(resp.read()).get("data") or []
    except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
        raise InputError(f"{base_url}: cannot list models ({exc.__class__.__name__})",
                         hint="check the URL and that the server is up, or pass --model NAME") from exc
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):   # another shape: nothing stated
        return EndpointInfo(None, None)
    length = data[0].get("max_model_len")
    valid = isinstance(length, int) and not isinstance(length, bool) and length > 0
    return EndpointInfo(str(data[0]["id"]) if "id" in data[0] else None, length if valid else None)


def prompt_budget(max_model_len: int, output_tokens: int, endpoint: str) -> int:
    """Characters (hence at most tokens) left for a synthetic prompt; InputError when none are."""
    budget = max_model_len - output_tokens - PROMPT_MARGIN.get(endpoint, 4)
    if budget < 1:
        raise InputError(f"--output-tokens {output_tokens}: leaves no room for a prompt in the endpoint's "
                         f"context of {max_model_len} tokens",
                         hint=f"pass --output-tokens below {max_model_len - PROMPT_MARGIN.get(endpoint, 4)}")
    return budget


def min_prompt_tokens(sample: Sample) -> int:
    """Its token count when known, else a lower bound from its length in bytes."""
    if sample.prompt_tokens is not None:
        return sample.prompt_tokens
    return max(1, math.ceil(len(sample.prompt.encode()) / MAX_BYTES_PER_TOKEN))


def check_fit(samples: list[Sample], max_model_len: int) -> None:
    """InputError naming the first request that cannot fit: prompt + output tokens > the context."""
    for sample in samples:
        prompt = min_prompt_tokens(sample)
        if prompt + sample.output_tokens > max_model_len:
            known = "" if sample.prompt_tokens is not None else "at least "
            where = sample.source or "a dataset row"
            raise InputError(
                f"{where}: prompt ({known}{prompt} tokens) + output ({sample.output_tokens}) exceeds the endpoint's "
                f"context of {max_model_len} tokens",
                hint="drop or shorten such rows, lower their output_tokens, or serve a model with a longer context")
