"""Scoring eval rows on a model that batches (the PyTorch reference: `batch_generate_with_logits`): the greedy
answer of every row and the teacher-forced log-probabilities of its expected tokens, a batch of rows per
pass over the weights instead of one row (and one token) per forward.

The same figures as the eval gate's row-at-a-time scoring (gates/eval.py `score_rows`): the same token ids,
targets from where the prompt's and the full text's tokenizations diverge, EOS dropped from the answer.
A row whose prompt and answer would run past the context is scored the row-at-a-time way instead (a batch
is cut to its longest prompt's room), so batching never changes what a row is scored on.

Also the JSON form of scored rows, for the release's reference cache (release/gating/reference.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from gates.eval_data import EvalRow
from gates.metrics import ScoredRow
from release.backends.base import LoadedModel

BATCH = 8  # rows per call: the reference batches them per weight pass; the logits of one batch at a time


@runtime_checkable
class BatchScoring(Protocol):
    def batch_generate_with_logits(self, prompts: list[list[int]], max_new_tokens: int
                                   ) -> list[tuple[list[int], np.ndarray]]: ...


def forced_ids(model: LoadedModel, prompt: str, expected: str, separator: str) -> tuple[list[int], int]:
    """The ids of prompt + separator + expected + EOS, and where the targets start: where the prompt's and the
    full text's tokenizations diverge (so a merge across the boundary cannot shift them), at least 1."""
    prompt_ids = model.encode(prompt)
    full_ids = model.encode(prompt + separator + expected) + model.eos_token_ids[:1]
    start = next((i for i, (a, b) in enumerate(zip(prompt_ids, full_ids, strict=False)) if a != b), len(prompt_ids))
    return full_ids, max(start, 1)


def target_scores(logits: np.ndarray, targets: Sequence[int]) -> tuple[tuple[float, ...], tuple[bool, ...]]:
    """Log-probability and argmax hit of each target under `logits` (one row per target position)."""
    wanted = np.asarray(targets)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    picked = log_probs[np.arange(len(wanted)), wanted]
    hits = logits.argmax(axis=1) == wanted
    return tuple(float(v) for v in picked), tuple(bool(h) for h in hits)


def fits_batched(model: LoadedModel, rows: Sequence[EvalRow], max_new_tokens: int, separator: str) -> bool:
    """Whether every row's prompt plus its new tokens, and its teacher-forced text, stay within the context."""
    context = model.context_length
    return all(len(model.encode(r.prompt)) + max_new_tokens <= context
               and len(forced_ids(model, r.prompt, r.expected, separator)[0]) <= context for r in rows)


def score_batched(model: LoadedModel, scoring: BatchScoring, rows: Sequence[EvalRow], max_new_tokens: int,
                  separator: str, needs_logits: bool) -> list[ScoredRow]:
    """Every row scored BATCH at a time: greedy answers, then (when asked) the teacher-forced targets."""
    eos = set(model.eos_token_ids)
    out: list[ScoredRow] = []
    for begin in range(0, len(rows), BATCH):
        chunk = rows[begin:begin + BATCH]
        answers = scoring.batch_generate_with_logits([model.encode(r.prompt) for r in chunk], max_new_tokens)
        outputs = [model.decode([t for t in ids if t not in eos]).strip() for ids, _ in answers]
        del answers  # the logits of prompt + answer are not needed here: one batch's worth held at a time
        scored: list[tuple[tuple[float, ...] | None, tuple[bool, ...] | None]] = [(None, None)] * len(chunk)
        if needs_logits:
            forced = [forced_ids(model, r.prompt, r.expected, separator) for r in chunk]
            logits = scoring.batch_generate_with_logits([ids[:-1] for ids, _ in forced], 0)
            scored = [target_scores(row_logits[start - 1:], ids[start:])
                      for (ids, start), (_, row_logits) in zip(forced, logits, strict=True)]
        out += [ScoredRow(r.prompt, r.expected, text, logprobs, hits)
                for r, text, (logprobs, hits) in zip(chunk, outputs, scored, strict=True)]
    return out


def rows_to_json(rows: Sequence[ScoredRow]) -> list[dict[str, Any]]:
    return [{"prompt": r.prompt, "expected": r.expected, "output": r.output,
             "target_logprobs": None if r.target_logprobs is None else list(r.target_logprobs),
             "target_hits": None if r.target_hits is None else list(r.target_hits)} for r in rows]


def rows_from_json(data: list[dict[str, Any]]) -> list[ScoredRow]:
    return [ScoredRow(d["prompt"], d["expected"], d["output"],
                      None if d["target_logprobs"] is None else tuple(float(v) for v in d["target_logprobs"]),
                      None if d["target_hits"] is None else tuple(bool(v) for v in d["target_hits"]))
            for d in data]
