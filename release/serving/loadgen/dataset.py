"""Request contents drawn from a JSONL dataset: prompt (or chat messages) and output length per row."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from release.core.errors import InputError
from release.core.jsonfile import read_jsonl


@dataclass(frozen=True)
class Sample:
    """One request's contents. `prompt_tokens`: its length when known (trace rows that give lengths);
    `source`: where it came from, for error messages."""

    prompt: str
    messages: tuple[tuple[str, str], ...] | None
    output_tokens: int
    prompt_tokens: int | None = None
    source: str = ""

    def completion_body(self) -> dict[str, Any]:
        return {"prompt": self.prompt}

    def chat_body(self) -> dict[str, Any]:
        messages = self.messages or (("user", self.prompt),)
        return {"messages": [{"role": role, "content": content} for role, content in messages]}


def load_dataset(path: Path, default_output_tokens: int) -> list[Sample]:
    """Rows: {"prompt": str} or {"messages": [{"role", "content"}]}, optional "output_tokens"."""
    if not path.is_file():
        raise InputError(f"{path}: no such dataset file", hint="pass --dataset FILE.jsonl")
    samples = []
    for number, row in read_jsonl(path, hint="one JSON object per line"):
        samples.append(parse_row(row, f"{path.name}: line {number}", default_output_tokens))
    if not samples:
        raise InputError(f"{path.name}: no rows",
                         hint='one JSON object per line, e.g. {"prompt": "...", "output_tokens": 64}')
    return samples


def parse_row(row: Any, where: str, default_output_tokens: int) -> Sample:
    if not isinstance(row, dict):
        raise InputError(f"{where}: must be a JSON object", hint='e.g. {"prompt": "...", "output_tokens": 64}')
    out = row.get("output_tokens", row.get("max_tokens", default_output_tokens))
    if not isinstance(out, int) or isinstance(out, bool) or out < 1:
        raise InputError(f"{where}: output_tokens must be a positive integer", hint="e.g. \"output_tokens\": 64")
    if isinstance(row.get("prompt"), str) and row["prompt"]:
        return Sample(row["prompt"], None, out, source=where)
    messages = row.get("messages")
    if isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        pairs = tuple((m["role"], m["content"]) for m in messages)
        return Sample("\n".join(content for _, content in pairs), pairs, out, source=where)
    raise InputError(f"{where}: needs a non-empty 'prompt' or 'messages' list of {{role, content}}",
                     hint='e.g. {"prompt": "Summarize ...", "output_tokens": 64}')


def draw_samples(samples: list[Sample], n: int, seed: int) -> list[Sample]:
    """`n` rows drawn with replacement (seeded), so lengths follow the dataset's distribution."""
    rng = np.random.default_rng(seed + 1)
    return [samples[int(i)] for i in rng.integers(0, len(samples), size=n)]


# Short, common English words: about one token each in LLM vocabularies, and never more tokens than
# characters in any byte-level or character tokenizer.
VOCAB = ("the", "model", "serves", "requests", "with", "tokens", "from", "many", "prompts", "of", "different",
         "lengths", "while", "a", "load", "test", "measures", "latency", "throughput", "and", "errors", "under",
         "bursty", "traffic")


def synthetic_dataset(n: int, seed: int, output_tokens: int | tuple[int, int], prompt_words: tuple[int, int] = (4, 96),
                      max_prompt_chars: int | None = None) -> list[Sample]:
    """A seeded stand-in when no dataset is given: log-uniform prompt lengths, `output_tokens` each
    (a (low, high) pair: drawn uniformly from it).

    `max_prompt_chars` caps each prompt (it is a bound on its tokens too: no tokenizer makes more tokens
    than characters of plain ASCII words), which is how prompts are sized to an endpoint's context.
    """
    rng = np.random.default_rng(seed + 2)
    lo, hi = np.log(prompt_words[0]), np.log(prompt_words[1])
    rows = []
    for _ in range(n):
        words = int(np.exp(rng.uniform(lo, hi)))
        prompt = " ".join(VOCAB[int(i)] for i in rng.integers(0, len(VOCAB), size=words))
        if max_prompt_chars is not None:
            prompt = prompt[:max_prompt_chars].rstrip() or VOCAB[0][:max_prompt_chars]
        out = output_tokens if isinstance(output_tokens, int) else int(rng.integers(output_tokens[0],
                                                                                      output_tokens[1] + 1))
        rows.append(Sample(prompt, None, out, source="synthetic"))
    return rows


def prompt_of_length(tokens: int, salt: int) -> str:
    """Text of `tokens` common words (about one token each), varied by `salt`; for rows that give only
    a length (public traces, request logs whose content was redacted or hashed)."""
    return " ".join(VOCAB[(salt * 7 + k * 5 + k // len(VOCAB)) % len(VOCAB)] for k in range(max(1, tokens)))

