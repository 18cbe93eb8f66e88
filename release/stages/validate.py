"""Validate: quality of a converted candidate against the fp32 reference on the same prompts.

Each prompt is tokenized with the training tokenizer and extended by the reference's greedy
continuation (max_new_tokens). On that sequence, teacher-forced through model.onnx directly:
- top1_agreement, mean_kl (KL(reference || candidate), float64): over every position;
- perplexity_*: over the continuation tokens, i.e. how well the candidate predicts what the reference
  would serve. Prompt tokens are a poor basis: fine-tuning usually masks them out of the loss, so the
  model never learned to predict them (the tiny example's prompt perplexity is worse than uniform and
  swings with any quantization noise). Their perplexity is still reported, as prompt_perplexity_*,
  without a threshold.
greedy_agreement compares the reference continuation with the candidate's own greedy generation through
its backend and its served tokenizer (what production will do); both builds are loaded by the backend that
built them (release/backends/), so validation knows no engine's files. Validation never raises to block a
release: a failing candidate returns passed=False with failures naming metric, value and threshold; bad input (a missing
or malformed prompts file, a missing folder) is an InputError.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field
from tokenizers import Tokenizer

from release.backends import get_backend
from release.backends.base import Backend, LoadedModel
from release.config import ValidationConfig
from release.core.checks import ThresholdCheck
from release.core.errors import InputError, ReleaseError
from release.core.package import missing_runtime
from release.core.tokenizer_parity import EDGE_STRINGS, TokenizerParity, compare_tokenizers
from release.stages.base import Stage, StageInputs, StageResult, location


class NonFiniteLogits(ValueError):
    """The candidate computed NaN or Inf: evidence against it, reported by name."""


def load_prompts(path: Path) -> list[str]:
    """Prompts from a JSONL file of {"prompt": "..."} objects; InputError naming the line on any defect."""
    if not path.is_file():
        raise InputError(f"{path}: prompts file not found",
                         hint="pass a JSONL file with one {\"prompt\": ...} per line")
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


def validate(
    reference_dir: Path,
    candidate_dir: Path,
    prompts: list[str],
    training_tokenizer: Path,
    thresholds: ValidationConfig,
    backend: Backend,
) -> ValidateResult:
    """Compare `candidate_dir` with the fp32 `reference_dir` (both built by `backend`) on `prompts`; never
    raises to block."""
    if not prompts:
        raise InputError("validate: no prompts given", hint="pass the prompts from load_prompts(path)")

    if not training_tokenizer.is_file():
        raise InputError(f"{training_tokenizer}: training tokenizer not found",
                         hint="pass the checkpoint's tokenizer.json")
    token_ids = [list(Tokenizer.from_file(str(training_tokenizer)).encode(p).ids) for p in prompts]
    reference = backend.load_reference(reference_dir)
    continuations = [reference.generate_ids(ids, thresholds.max_new_tokens) for ids in token_ids]
    # The candidate's runtime files are checked up front: a folder that is not a model is bad input,
    # while a model that fails to load or run is evidence against the candidate.
    missing_runtime(backend, candidate_dir, candidate_dir.name)
    parity = TokenizerParity(passed=False, checked=0)
    try:
        candidate = backend.load(candidate_dir)
        parity = compare_tokenizers(candidate.encode, training_tokenizer, [*prompts, *EDGE_STRINGS])
        metrics = logit_metrics(reference, candidate, token_ids, continuations)
        greedy, samples = greedy_metrics(candidate, prompts, continuations, thresholds.max_new_tokens)
        metrics.update(greedy)
    except ReleaseError:
        raise
    except NonFiniteLogits as exc:
        return failed(parity, f"candidate: {exc} (overflow at this precision?)")
    except Exception as exc:  # a candidate that cannot run is evidence, not a relctl crash
        message = f"candidate: failed to run ({exc.__class__.__name__}: {str(exc).splitlines()[0][:200]})"
        return failed(parity, message)
    metrics["tokenizer_parity"] = 1.0 if parity.passed else 0.0
    checks = threshold_checks(metrics, thresholds)
    failures = [describe_failure(c) for c in checks if not c.passed]
    if not parity.passed and parity.first_mismatch is not None:
        mismatch = parity.first_mismatch
        failures.append(
            f"tokenizer_parity: served ids {mismatch['served_ids']} != training ids {mismatch['training_ids']} "
            f"for {mismatch['text']!r}"
        )
    return ValidateResult(
        metrics=metrics,
        checks=checks,
        tokenizer_parity=parity,
        passed=not failures,
        failures=failures,
        details={
            "prompts": len(prompts),
            "positions": sum(len(t) + len(c) for t, c in zip(token_ids, continuations, strict=True)),
            "greedy_samples": samples,
        },
    )


def logit_metrics(
    reference: LoadedModel, candidate: LoadedModel, token_ids: list[list[int]], continuations: list[list[int]]
) -> dict[str, float]:
    """top1_agreement and mean_kl over all positions; perplexities on continuation and prompt tokens."""
    agree, kls = [], []
    nll: dict[str, list[np.ndarray]] = {"ref": [], "cand": [], "prompt_ref": [], "prompt_cand": []}
    for number, (ids, continuation) in enumerate(zip(token_ids, continuations, strict=True), start=1):
        sequence = ids + continuation
        raw_cand = candidate.logits(sequence)
        if not np.isfinite(raw_cand).all():
            # NaN/Inf logits poison every average below; name them instead of reporting "top-1 0".
            raise NonFiniteLogits(f"candidate logits contain NaN or Inf on prompt {number}")
        log_ref = log_softmax(reference.logits(sequence).astype(np.float64))
        log_cand = log_softmax(raw_cand.astype(np.float64))
        agree.append(log_ref.argmax(-1) == log_cand.argmax(-1))
        kls.append((np.exp(log_ref) * (log_ref - log_cand)).sum(-1))
        # Position i predicts token i + 1.
        split = len(ids) - 1
        targets = np.asarray(sequence[1:])
        positions = np.arange(len(sequence) - 1)
        for key, logp in (("ref", log_ref), ("cand", log_cand)):
            token_nll = -logp[positions, targets]
            nll[key].append(token_nll[split:])
            nll[f"prompt_{key}"].append(token_nll[:split])
    ppl_ref, ppl_cand = perplexity(nll["ref"]), perplexity(nll["cand"])
    prompt_ref, prompt_cand = perplexity(nll["prompt_ref"]), perplexity(nll["prompt_cand"])
    return {
        "top1_agreement": float(np.concatenate(agree).mean()),
        "mean_kl": float(np.concatenate(kls).mean()),
        "perplexity_reference": ppl_ref,
        "perplexity_candidate": ppl_cand,
        "perplexity_increase": ppl_cand / ppl_ref - 1.0,
        "prompt_perplexity_reference": prompt_ref,
        "prompt_perplexity_candidate": prompt_cand,
        "prompt_perplexity_increase": prompt_cand / prompt_ref - 1.0,
    }


def greedy_metrics(
    candidate: LoadedModel, prompts: list[str], continuations: list[list[int]], max_new_tokens: int
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Share of prompts whose greedy output equals the reference's, and the mean matched-prefix share."""
    identical = 0
    prefix_shares: list[float] = []
    samples: list[dict[str, Any]] = []
    for prompt, ref in zip(prompts, continuations, strict=True):
        cand = candidate.generate(prompt, max_new_tokens).token_ids
        identical += ref == cand
        matched = next((i for i, (a, b) in enumerate(zip(ref, cand, strict=False)) if a != b), min(len(ref), len(cand)))
        prefix_shares.append(matched / max(len(ref), len(cand), 1))
        if len(samples) < 5 or ref != cand:
            samples.append({"prompt": prompt, "reference": ref, "candidate": cand})
    return (
        {"greedy_agreement": identical / len(prompts), "greedy_prefix_match": float(np.mean(prefix_shares))},
        samples[:20],
    )


def failed(parity: TokenizerParity, message: str) -> ValidateResult:
    return ValidateResult(metrics={}, checks=[], tokenizer_parity=parity, passed=False, failures=[message],
                          details={})


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
    tokens = np.concatenate(nlls) if nlls else np.zeros(0)
    if tokens.size == 0:
        return float("nan")
    return math.exp(float(tokens.mean()))


class ValidateInputs(StageInputs):
    reference: str = Field(description="fingerprint of the fp32 reference build")
    candidate: str = Field(description="fingerprint of the candidate build")
    prompts_sha256: str
    thresholds: ValidationConfig
    reference_dir: Path = location()
    candidate_dir: Path = location()
    prompts_path: Path = location()
    backend: str = Field(description="id of the backend that built both folders")
    tokenizer: Path = location()


class ValidateResult(StageResult):
    """The verdict and its evidence (also written as validation.json in the stage folder)."""

    report: str = "validation.json"
    passed: bool
    failures: list[str]
    metrics: dict[str, float]
    checks: list[ThresholdCheck]
    tokenizer_parity: TokenizerParity
    details: dict[str, Any]


class ValidateStage(Stage[ValidateInputs, ValidateResult]):
    """Quality of the candidate against the fp32 reference; a failing candidate is a result, not an error."""

    name = "validate"
    result_type = ValidateResult

    def run(self, out: Path) -> ValidateResult:
        i = self.inputs
        result = validate(i.reference_dir, i.candidate_dir, load_prompts(i.prompts_path), i.tokenizer, i.thresholds,
                          get_backend(i.backend))
        (out / result.report).write_text(json.dumps(result.model_dump(), indent=2, default=str))
        return result

    def summary(self, result: ValidateResult) -> str:
        m = result.metrics
        verdict = "pass" if result.passed else "FAIL"
        return (f"{verdict}: top-1 {m.get('top1_agreement', float('nan')):.3f}, "
                f"KL {m.get('mean_kl', float('nan')):.2e}, greedy {m.get('greedy_agreement', float('nan')):.2f}")
