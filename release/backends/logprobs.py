"""Token log-probabilities from an engine's logits, for a ScoringRunner: the prompt's tokens under teacher
forcing (`echo`) and each generated token (`logprobs`), with the top-k alternatives at each position.

The log-softmax runs in float64 over the engine's float32 logits, so what a client sums over a
continuation (lm-eval's log-likelihood) carries no rounding of relctl's own beyond the engine's.
"""

from __future__ import annotations

import numpy as np

from release.backends.jobs import TokenScore


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Rows of log-probabilities (float64) from rows of logits."""
    rows = np.asarray(logits, dtype=np.float64)
    shifted = rows - rows.max(axis=-1, keepdims=True)
    result: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return result


def score_token(row: np.ndarray, token: int, k: int) -> TokenScore:
    """`token`'s log-probability under one row of logits, and that row's `k` most likely tokens."""
    logp = log_softmax(row[None, :])[0]
    return TokenScore(token, float(logp[token]), top_tokens(logp, k))


def score_prompt(logits: np.ndarray, ids: list[int], k: int) -> list[TokenScore]:
    """Teacher-forced scores of `ids` from `logits` (len(ids), vocab), row i predicting token i + 1: the
    first token has no log-probability (nothing predicts it), as in OpenAI's `echo`."""
    if logits.shape[0] != len(ids):
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(ids)} tokens")
    logp = log_softmax(logits[:-1]) if len(ids) > 1 else np.empty((0, logits.shape[1]))
    scores = [TokenScore(ids[0], None, None)]
    scores += [TokenScore(ids[i + 1], float(logp[i, ids[i + 1]]), top_tokens(logp[i], k)) for i in range(len(ids) - 1)]
    return scores


def top_tokens(logp: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
    """The `k` most likely tokens of one row of log-probabilities, most likely first (ties by token id)."""
    if k <= 0:
        return ()
    k = min(k, logp.shape[0])
    candidates = np.argpartition(-logp, k - 1)[:k]
    ordered = sorted(candidates.tolist(), key=lambda t: (-logp[t], t))
    return tuple((int(t), float(logp[t])) for t in ordered)
