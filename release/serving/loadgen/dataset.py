"""Request contents drawn from a JSONL dataset: prompt (or chat messages) and output length per row."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from release.errors import InputError


@dataclass(frozen=True)
class Sample:
    prompt: str
    messages: tuple[tuple[str, str], ...] | None
    output_tokens: int

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
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            samples.append(parse_row(_json(path, number, line), f"{path.name}: line {number}", default_output_tokens))
    if not samples:
        raise InputError(f"{path.name}: no rows", hint='one JSON object per line, e.g. {"prompt": "...", "output_tokens": 64}')
    return samples


def parse_row(row: Any, where: str, default_output_tokens: int) -> Sample:
    if not isinstance(row, dict):
        raise InputError(f"{where}: must be a JSON object", hint='e.g. {"prompt": "...", "output_tokens": 64}')
    out = row.get("output_tokens", row.get("max_tokens", default_output_tokens))
    if not isinstance(out, int) or isinstance(out, bool) or out < 1:
        raise InputError(f"{where}: output_tokens must be a positive integer", hint="e.g. \"output_tokens\": 64")
    if isinstance(row.get("prompt"), str) and row["prompt"]:
        return Sample(row["prompt"], None, out)
    messages = row.get("messages")
    if isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        pairs = tuple((m["role"], m["content"]) for m in messages)
        return Sample("\n".join(content for _, content in pairs), pairs, out)
    raise InputError(f"{where}: needs a non-empty 'prompt' or 'messages' list of {{role, content}}",
                     hint='e.g. {"prompt": "Summarize ...", "output_tokens": 64}')


def draw_samples(samples: list[Sample], n: int, seed: int) -> list[Sample]:
    """`n` rows drawn with replacement (seeded), so lengths follow the dataset's distribution."""
    rng = np.random.default_rng(seed + 1)
    return [samples[int(i)] for i in rng.integers(0, len(samples), size=n)]


def synthetic_dataset(n: int, seed: int, prompt_words: tuple[int, int] = (4, 96),
                      output_tokens: tuple[int, int] = (8, 64)) -> list[Sample]:
    """A seeded stand-in when no dataset is given: log-uniform prompt lengths, uniform output lengths."""
    rng = np.random.default_rng(seed + 2)
    vocab = ["the", "model", "serves", "requests", "with", "tokens", "from", "many", "prompts", "of", "different", "lengths", "while", "a", "load", "test", "measures", "latency", "throughput", "and", "errors", "under", "bursty", "traffic"]
    lo, hi = np.log(prompt_words[0]), np.log(prompt_words[1])
    rows = []
    for _ in range(n):
        words = int(np.exp(rng.uniform(lo, hi)))
        prompt = " ".join(vocab[int(i)] for i in rng.integers(0, len(vocab), size=words))
        rows.append(Sample(prompt, None, int(rng.integers(output_tokens[0], output_tokens[1] + 1))))
    return rows


def _json(path: Path, number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path.name}: line {number} is not JSON", hint="one JSON object per line") from exc
