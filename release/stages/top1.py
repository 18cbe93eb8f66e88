"""Top-1 agreement that a near-tie cannot decide: validation's threshold applies to it.

Raw agreement counts every position of every prompt: the reference's argmax against the candidate's. Two
things make that number misleading on a real prompt set:
- a **near-tie**: where the reference's two most likely tokens are a hair apart, which one a candidate
  picks says nothing about its quality (any rounding flips it), yet raw agreement counts the flip as a miss;
- a **repeated prefix**: the position after the start token (and any shared preamble) is the same decision
  in every prompt, so one flip there is counted once per prompt.
On the tiny example both met: the first position is the same in all 32 prompts, the fp32 model's top two
tokens there are 0.011 nats apart, and int8 (KL 1.3e-4, greedy 1.00) lost raw agreement to 0.917 on that
one repeated decision.

Tie-aware agreement counts each distinct token prefix once (its first occurrence) and only where the
reference's top-2 margin (log p1 - log p2, release/stages/reference.py: top2_margins) exceeds
`validation.near_tie_nats`. Both are reported, with how many prefixes were near-ties and how many repeated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from release.stages.reference import PromptReference, top2_margins


@dataclass(frozen=True)
class Top1Agreement:
    raw: float             # every position of every prompt
    tie_aware: float       # distinct prefixes whose reference margin exceeds the epsilon (nan: none does)
    counted: int           # the prefixes tie_aware is over
    near_ties: int         # distinct prefixes left out: the reference's top two within the epsilon
    repeated: int          # positions left out because an earlier prompt had the same prefix

    def metrics(self) -> dict[str, float]:
        return {"top1_agreement": self.tie_aware, "top1_agreement_raw": self.raw,
                "top1_positions": float(self.counted), "top1_near_ties": float(self.near_ties),
                "top1_repeated_prefixes": float(self.repeated)}


def top1_agreement(refs: list[PromptReference], candidate_argmax: list[np.ndarray],
                   near_tie_nats: float) -> Top1Agreement:
    """Raw and tie-aware top-1 agreement; `candidate_argmax[i]` is the candidate's argmax at each position
    of prompt i's sequence (prompt + the reference's continuation)."""
    agree_all: list[np.ndarray] = []
    # A trie of the token prefixes seen: (node, next token) -> node. A position's prefix is its node.
    children: dict[tuple[int, int], int] = {}
    seen: set[int] = set()
    counted = near_ties = repeated = agreed = 0
    for ref, argmax in zip(refs, candidate_argmax, strict=True):
        agree = ref.top_ids[:, 0] == argmax
        agree_all.append(agree)
        margins = top2_margins(ref)
        node = 0
        for position, token in enumerate(ref.sequence[:len(agree)]):
            node = children.setdefault((node, int(token)), len(children) + 1)
            if node in seen:
                repeated += 1
                continue
            seen.add(node)
            if margins[position] <= near_tie_nats:
                near_ties += 1
                continue
            counted += 1
            agreed += bool(agree[position])
    raw = float(np.concatenate(agree_all).mean()) if agree_all else float("nan")
    return Top1Agreement(raw=raw, tie_aware=agreed / counted if counted else float("nan"), counted=counted,
                         near_ties=near_ties, repeated=repeated)
