"""Validate: quality of a converted candidate against the reference on the same prompts.

The reference is what the checkpoint itself computes (release/stages/reference.py: PyTorch eager on the
merged checkpoint, kept on disk as top-k log-probabilities) or, for a backend that validates against its
own fp32 build, that build. Each prompt is tokenized with the training tokenizer and extended by the
reference's greedy continuation (max_new_tokens). On that sequence, teacher-forced through the candidate:
- top1_agreement: the reference's argmax against the candidate's, tie-aware (release/stages/top1.py): each
  distinct token prefix once, and only where the reference's top two tokens are more than
  validation.near_tie_nats apart; top1_agreement_raw counts every position of every prompt;
- mean_kl: KL(reference || candidate) in float64 over every position, on the reference's top-k tokens
  plus one bucket for the rest of the vocabulary (exact when the reference kept the whole distribution,
  vocabularies up to 4,096; a lower bound otherwise, which the top 64 make tight for a trained model);
- perplexity_*: over the continuation tokens, i.e. how well the candidate predicts what the reference
  would serve. Prompt tokens are a poor basis: fine-tuning usually masks them out of the loss, so the
  model never learned to predict them (the tiny example's prompt perplexity is worse than uniform and
  swings with any quantization noise). Their perplexity is still reported, as prompt_perplexity_*,
  without a threshold.
greedy_agreement compares the reference continuation with the candidate's own greedy generation through
its backend and its served tokenizer (what production will do). The reference's numbers are complete
before the candidate loads, and the reference model is gone by then: the two never share memory.
Validation never raises to block a release: a failing candidate returns passed=False with failures naming
metric, value and threshold; bad input (a missing or malformed prompts file, a missing folder) is an
InputError. A candidate the engine cannot load or run is neither: it has no quality to judge, so it is a
build/engine failure (StageFailed, exit 4) carrying the engine's own message, never a verdict whose advice
would be to relax the thresholds. Only NaN/Inf logits, which the candidate did compute, are a verdict.
"""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from release.backends import get_backend
from release.backends.base import Backend, LoadedModel
from release.config import ValidationConfig
from release.core.checks import ThresholdCheck
from release.core.errors import InputError, ReleaseError, StageFailed
from release.core.jsonfile import read_jsonl
from release.core.package import missing_runtime
from release.core.tokenizer_parity import EDGE_STRINGS, TokenizerParity, compare_tokenizers
from release.stages import reference as reference_stage
from release.stages.base import Stage, StageInputs, StageResult, location
from release.stages.reference import PromptReference, log_softmax
from release.stages.top1 import top1_agreement


class NonFiniteLogits(ValueError):
    """The candidate computed NaN or Inf: evidence against it, reported by name."""


def load_prompts(path: Path) -> list[str]:
    """Prompts from a JSONL file of {"prompt": "..."} objects; InputError naming the line on any defect."""
    if not path.is_file():
        raise InputError(f"{path}: prompts file not found",
                         hint="pass a JSONL file with one {\"prompt\": ...} per line")
    prompts: list[str] = []
    for number, row in read_jsonl(path, hint="fix that line: one {\"prompt\": ...} per line"):
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
    """Compare `candidate_dir` (built by `backend`) with the reference in `reference_dir` on `prompts`: a
    reference stage's folder (REFERENCE_FILE), else a folder `backend.load_reference` loads (its fp32
    build, or a checkpoint); never raises to block."""
    if not prompts:
        raise InputError("validate: no prompts given", hint="pass the prompts from load_prompts(path)")
    token_ids = reference_stage.token_ids_of(prompts, training_tokenizer)
    saved = reference_dir / reference_stage.REFERENCE_FILE
    if saved.is_file():
        refs = reference_stage.load(saved, token_ids, thresholds.max_new_tokens)
    else:
        refs = reference_stage.compute(backend.load_reference(reference_dir), token_ids, thresholds.max_new_tokens)
        gc.collect()  # the reference model is unreachable now: gone before the candidate loads
    continuations = [r.continuation for r in refs]
    # The candidate's runtime files are checked up front: a folder that is not a model is bad input,
    # while a model that fails to load or run is a build/engine failure (cannot_run).
    missing_runtime(backend, candidate_dir, candidate_dir.name)
    parity = TokenizerParity(passed=False, checked=0)
    try:
        candidate = backend.load(candidate_dir)
        parity = compare_tokenizers(candidate.encode, training_tokenizer, [*prompts, *EDGE_STRINGS])
        metrics = logit_metrics(refs, candidate, thresholds.near_tie_nats)
        greedy, samples = greedy_metrics(candidate, prompts, continuations, thresholds.max_new_tokens)
        metrics.update(greedy)
    except ReleaseError:
        raise
    except NonFiniteLogits as exc:
        return failed(parity, f"candidate: {exc} (overflow at this precision?)")
    except Exception as exc:  # the engine's own failure: named, not turned into a quality verdict
        raise cannot_run(backend, candidate_dir, exc) from exc
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
            "positions": sum(len(r.sequence) for r in refs),
            "reference_top_k": int(refs[0].top_ids.shape[1]),
            "greedy_samples": samples,
        },
    )


def kl_top_k(ref: PromptReference, log_cand: np.ndarray) -> np.ndarray:
    """KL(reference || candidate) per position over the reference's top-k tokens plus one bucket for the
    rest (exact when k is the vocabulary: the rest is empty)."""
    log_p = ref.top_logprobs.astype(np.float64)
    log_q = np.take_along_axis(log_cand, ref.top_ids.astype(np.int64), axis=-1)
    p = np.exp(log_p)
    kl = (p * (log_p - log_q)).sum(-1)
    if ref.top_ids.shape[1] < log_cand.shape[-1]:
        p_rest = np.clip(1.0 - p.sum(-1), 0.0, 1.0)
        q_rest = np.clip(1.0 - np.exp(log_q).sum(-1), 1e-300, 1.0)
        rest = np.where(p_rest > 1e-12, p_rest * (np.log(np.maximum(p_rest, 1e-300)) - np.log(q_rest)), 0.0)
        kl = kl + rest
    return np.asarray(kl)


def logit_metrics(refs: list[PromptReference], candidate: LoadedModel,
                  near_tie_nats: float = ValidationConfig().near_tie_nats) -> dict[str, float]:
    """top1_agreement (tie-aware, and raw), mean_kl over all positions; perplexities on continuation and
    prompt tokens."""
    argmax, kls = [], []
    nll: dict[str, list[np.ndarray]] = {"ref": [], "cand": [], "prompt_ref": [], "prompt_cand": []}
    for number, ref in enumerate(refs, start=1):
        sequence = ref.sequence
        raw_cand = candidate.logits(sequence)
        if not np.isfinite(raw_cand).all():
            # NaN/Inf logits poison every average below; name them instead of reporting "top-1 0".
            raise NonFiniteLogits(f"candidate logits contain NaN or Inf on prompt {number}")
        log_cand = log_softmax(raw_cand.astype(np.float64))
        argmax.append(log_cand.argmax(-1))
        kls.append(kl_top_k(ref, log_cand))
        # Position i predicts token i + 1.
        split = len(ref.ids) - 1
        targets = np.asarray(sequence[1:])
        positions = np.arange(len(sequence) - 1)
        for key, token_nll in (("ref", -ref.next_logprobs), ("cand", -log_cand[positions, targets])):
            nll[key].append(token_nll[split:])
            nll[f"prompt_{key}"].append(token_nll[:split])
    ppl_ref, ppl_cand = perplexity(nll["ref"]), perplexity(nll["cand"])
    prompt_ref, prompt_cand = perplexity(nll["prompt_ref"]), perplexity(nll["prompt_cand"])
    return {
        **top1_agreement(refs, argmax, near_tie_nats).metrics(),
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
    batch = getattr(candidate, "generate_batch", None)
    if batch is not None:  # an engine that generates for every prompt in one pass (one weight read a token)
        generated = batch([candidate.encode(p) for p in prompts], max_new_tokens)
    else:
        generated = [candidate.generate(p, max_new_tokens).token_ids for p in prompts]
    for prompt, ref, cand in zip(prompts, continuations, generated, strict=True):
        identical += ref == cand
        matched = next((i for i, (a, b) in enumerate(zip(ref, cand, strict=False)) if a != b), min(len(ref), len(cand)))
        prefix_shares.append(matched / max(len(ref), len(cand), 1))
        if len(samples) < 5 or ref != cand:
            samples.append({"prompt": prompt, "reference": ref, "candidate": cand})
    return (
        {"greedy_agreement": identical / len(prompts), "greedy_prefix_match": float(np.mean(prefix_shares))},
        samples[:20],
    )


def engine_message(exc: BaseException) -> str:
    """The engine's words for `exc` on one line: onnxruntime's useful part ("Status Message: ...") comes
    after a long node name, so the line is kept whole up to a bound rather than cut at 200 characters."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = " ".join(lines) if lines else "(no message)"
    return f"{exc.__class__.__name__}: {text[:600]}"


def cannot_run(backend: Backend, candidate_dir: Path, exc: BaseException) -> StageFailed:
    """A candidate that fails to load or run is a build/engine failure (exit 4), not a quality verdict."""
    return StageFailed(
        f"validate: the candidate built by {backend.id} cannot run in its engine ({engine_message(exc)})",
        hint=f"this is a build or engine failure, not a quality verdict: the thresholds are not the cause; "
             f"the built folder is {candidate_dir} and convert's log lies beside it",
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
    name = "top1_agreement (tie-aware)" if check.metric == "top1_agreement" else check.metric
    return f"{name} = {check.value:.6g}, required {check.op} {check.bound:.6g}"


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
        ties = int(m.get("top1_near_ties", 0))
        return (f"{verdict}: top-1 {m.get('top1_agreement', float('nan')):.3f} tie-aware "
                f"(raw {m.get('top1_agreement_raw', float('nan')):.3f}; {ties} near-tie{'' if ties == 1 else 's'}, "
                f"{m.get('top1_repeated_prefixes', 0):.0f} repeated prefixes not counted), "
                f"KL {m.get('mean_kl', float('nan')):.2e}, greedy {m.get('greedy_agreement', float('nan')):.2f}")
