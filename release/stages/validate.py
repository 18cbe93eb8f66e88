"""Validate: quality of a converted candidate against the fp32 reference on the same prompts.

Logit metrics are teacher-forced on the training tokenizer's ids (what the model was trained on), run
through model.onnx directly; greedy agreement goes through onnxruntime-genai with each folder's own
served tokenizer (what production will do). Validation never raises to block a release: a failing
candidate returns passed=False with failures naming metric, value and threshold; bad input (a missing
or malformed prompts file, a missing folder) is an InputError.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from gates.base import ThresholdCheck
from release.config import ValidationConfig
from release.errors import InputError, ReleaseError
from release.runtime import GenaiModel, read_genai_config

# Strings every served tokenizer must encode like the training one, beside the prompts themselves.
EDGE_STRINGS = ("", " ", "   \t\n  ", "naïve café ✓ 日本語 🙂", "  leading and trailing  ", "Hello world")


@dataclass(frozen=True)
class TokenizerParity:
    """Served vs training tokenizer on `checked` strings; the first mismatch with both id lists."""

    passed: bool
    checked: int
    first_mismatch: dict[str, Any] | None = None


@dataclass
class ValidationReport:
    metrics: dict[str, float]
    checks: list[ThresholdCheck]
    tokenizer_parity: TokenizerParity
    passed: bool
    failures: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "metrics": dict(self.metrics),
            "checks": [asdict(c) for c in self.checks],
            "tokenizer_parity": asdict(self.tokenizer_parity),
            "failures": list(self.failures),
            "details": self.details,
        }


def load_prompts(path: Path) -> list[str]:
    """Prompts from a JSONL file of {"prompt": "..."} objects; InputError naming the line on any defect."""
    if not path.is_file():
        raise InputError(f"{path}: prompts file not found", hint="pass a JSONL file with one {\"prompt\": ...} per line")
    prompts: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path.name}: line {number} is not valid JSON ({exc.msg})", hint="fix that line") from exc
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise InputError(
                f"{path.name}: line {number} has no string field 'prompt'",
                hint='each line must be an object like {"prompt": "..."}',
            )
        prompts.append(row["prompt"])
    if not prompts:
        raise InputError(f"{path.name}: no prompts in the file", hint="add at least one {\"prompt\": ...} line")
    return prompts


def compare_tokenizers(
    encode: Callable[[str], list[int]], training_tokenizer: Path, texts: list[str]
) -> TokenizerParity:
    """Compare `encode` (the served tokenizer) with tokenizers' encode of `training_tokenizer` (BOS included)."""
    from tokenizers import Tokenizer

    if not training_tokenizer.is_file():
        raise InputError(f"{training_tokenizer}: training tokenizer not found", hint="pass the checkpoint's tokenizer.json")
    training = Tokenizer.from_file(str(training_tokenizer))
    for text in texts:
        served, expected = encode(text), list(training.encode(text).ids)
        if served != expected:
            return TokenizerParity(
                passed=False,
                checked=len(texts),
                first_mismatch={"text": text, "served_ids": served, "training_ids": expected},
            )
    return TokenizerParity(passed=True, checked=len(texts))


def validate(
    reference_dir: Path,
    candidate_dir: Path,
    prompts: list[str],
    training_tokenizer: Path,
    thresholds: ValidationConfig,
) -> ValidationReport:
    """Compare `candidate_dir` with the fp32 `reference_dir` on `prompts`; never raises to block."""
    if not prompts:
        raise InputError("validate: no prompts given", hint="pass the prompts from load_prompts(path)")
    from tokenizers import Tokenizer

    if not training_tokenizer.is_file():
        raise InputError(f"{training_tokenizer}: training tokenizer not found", hint="pass the checkpoint's tokenizer.json")
    token_ids = [list(Tokenizer.from_file(str(training_tokenizer)).encode(p).ids) for p in prompts]
    reference = GenaiModel.load(reference_dir)
    # The candidate's genai_config.json is checked up front: a folder that is not a model is bad input,
    # while a model that fails to load or run is evidence against the candidate.
    read_genai_config(candidate_dir)
    parity = TokenizerParity(passed=False, checked=0)
    try:
        candidate = GenaiModel.load(candidate_dir)
        parity = compare_tokenizers(candidate.encode, training_tokenizer, [*prompts, *EDGE_STRINGS])
        metrics = logit_metrics(reference, candidate, token_ids)
        greedy, samples = greedy_metrics(reference, candidate, prompts, thresholds.max_new_tokens)
        metrics.update(greedy)
    except ReleaseError:
        raise
    except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is evidence, not a relctl crash
        message = f"candidate: failed to run ({exc.__class__.__name__}: {str(exc).splitlines()[0][:200]})"
        return ValidationReport(metrics={}, checks=[], tokenizer_parity=parity, passed=False, failures=[message])
    metrics["tokenizer_parity"] = 1.0 if parity.passed else 0.0
    checks = threshold_checks(metrics, thresholds)
    failures = [describe_failure(c) for c in checks if not c.passed]
    if not parity.passed and parity.first_mismatch is not None:
        mismatch = parity.first_mismatch
        failures.append(
            f"tokenizer_parity: served ids {mismatch['served_ids']} != training ids {mismatch['training_ids']} "
            f"for {mismatch['text']!r}"
        )
    return ValidationReport(
        metrics=metrics,
        checks=checks,
        tokenizer_parity=parity,
        passed=not failures,
        failures=failures,
        details={"prompts": len(prompts), "positions": sum(len(t) for t in token_ids), "greedy_samples": samples},
    )


def logit_metrics(reference: GenaiModel, candidate: GenaiModel, token_ids: list[list[int]]) -> dict[str, float]:
    """top1_agreement, mean_kl and perplexities, pooled over every position of every prompt."""
    agree, kls, nll_ref, nll_cand = [], [], [], []
    for ids in token_ids:
        log_ref = log_softmax(reference.logits(ids).astype(np.float64))
        log_cand = log_softmax(candidate.logits(ids).astype(np.float64))
        agree.append(log_ref.argmax(-1) == log_cand.argmax(-1))
        kls.append((np.exp(log_ref) * (log_ref - log_cand)).sum(-1))
        if len(ids) > 1:
            targets = np.asarray(ids[1:])
            positions = np.arange(len(ids) - 1)
            nll_ref.append(-log_ref[positions, targets])
            nll_cand.append(-log_cand[positions, targets])
    ppl_ref = perplexity(nll_ref)
    ppl_cand = perplexity(nll_cand)
    return {
        "top1_agreement": float(np.concatenate(agree).mean()),
        "mean_kl": float(np.concatenate(kls).mean()),
        "perplexity_reference": ppl_ref,
        "perplexity_candidate": ppl_cand,
        "perplexity_increase": ppl_cand / ppl_ref - 1.0,
    }


def greedy_metrics(
    reference: GenaiModel, candidate: GenaiModel, prompts: list[str], max_new_tokens: int
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Share of prompts with identical greedy outputs, and the mean matched-prefix share."""
    identical = 0
    prefix_shares: list[float] = []
    samples: list[dict[str, Any]] = []
    for prompt in prompts:
        ref = reference.generate(prompt, max_new_tokens).token_ids
        cand = candidate.generate(prompt, max_new_tokens).token_ids
        identical += ref == cand
        matched = next((i for i, (a, b) in enumerate(zip(ref, cand)) if a != b), min(len(ref), len(cand)))
        prefix_shares.append(matched / max(len(ref), len(cand), 1))
        if len(samples) < 5 or ref != cand:
            samples.append({"prompt": prompt, "reference": ref, "candidate": cand})
    return (
        {"greedy_agreement": identical / len(prompts), "greedy_prefix_match": float(np.mean(prefix_shares))},
        samples[:20],
    )


def threshold_checks(metrics: dict[str, float], t: ValidationConfig) -> list[ThresholdCheck]:
    bounds: list[tuple[str, Literal[">=", "<="], float]] = [
        ("top1_agreement", ">=", t.min_top1_agreement),
        ("mean_kl", "<=", t.max_mean_kl),
        ("perplexity_increase", "<=", t.max_perplexity_increase),
        ("greedy_agreement", ">=", t.min_greedy_agreement),
        ("tokenizer_parity", ">=", 1.0),
    ]
    checks = []
    for metric, op, bound in bounds:
        value = metrics[metric]
        passed = value >= bound if op == ">=" else value <= bound
        checks.append(ThresholdCheck(metric=metric, value=value, op=op, bound=bound, passed=bool(passed)))
    return checks


def describe_failure(check: ThresholdCheck) -> str:
    return f"{check.metric} = {check.value:.6g}, required {check.op} {check.bound:.6g}"


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    result: np.ndarray = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return result


def perplexity(nlls: list[np.ndarray]) -> float:
    if not nlls:
        return float("nan")
    return math.exp(float(np.concatenate(nlls).mean()))
