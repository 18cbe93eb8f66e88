"""An adapter validated where it will run: the base as its engine serves it with the adapter active,
against the merged fp32 reference (PyTorch eager on base + adapter folded exactly as peft's merge_and_unload).

The comparison is validation's own (release/stages/validate.py: top-1 agreement, KL, perplexity, greedy
agreement); only the defaults are stricter, because base and adapter are the same weights either way: an
unmerged LoRA that differs from its merge is an engine bug (issue 30 names four), not noise.
"""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path

from release.backends.base import Backend
from release.config import ValidationConfig
from release.core.tokenizer_parity import EDGE_STRINGS, compare_tokenizers
from release.stages import reference as reference_stage
from release.stages.merge import merge_checkpoint
from release.stages.validate import ValidateResult, describe_failure, greedy_metrics, logit_metrics, threshold_checks

# The defaults for an adapter on its base (each lowered only by release.yaml's validation block saying so).
ADAPTER_DEFAULTS = {"min_top1_agreement": 0.99, "max_mean_kl": 0.01, "min_greedy_agreement": 0.99}


def adapter_thresholds(configured: ValidationConfig) -> ValidationConfig:
    """release.yaml's validation thresholds, with the adapter defaults where it left a field at its default."""
    given = configured.model_fields_set
    return configured.model_copy(update={k: v for k, v in ADAPTER_DEFAULTS.items() if k not in given})


def validate_adapter(backend: Backend, base_model_dir: Path, adapter_dir: Path, checkpoint: Path,
                     prompts: list[str], thresholds: ValidationConfig) -> ValidateResult:
    """Base + adapter as `backend` serves them, against base + adapter merged in fp32 (`checkpoint` holds
    the base weights the run trained on and its PEFT adapter)."""
    from release.backends.torch_reference import TorchReference  # noqa: PLC0415 - loads torch

    token_ids = reference_stage.token_ids_of(prompts, checkpoint / "tokenizer.json")
    with tempfile.TemporaryDirectory(prefix="relctl-merged-") as tmp:
        merged = Path(tmp) / "merged"
        merge_checkpoint(checkpoint, checkpoint, merged)
        refs = reference_stage.compute(TorchReference(merged), token_ids, thresholds.max_new_tokens)
    gc.collect()
    candidate = backend.load_with_adapter(base_model_dir, adapter_dir)
    # The served tokenizer is the base's: an adapter trained with another tokenizer is refused here.
    parity = compare_tokenizers(candidate.encode, checkpoint / "tokenizer.json", [*prompts, *EDGE_STRINGS])
    metrics = logit_metrics(refs, candidate, thresholds.near_tie_nats)
    greedy, samples = greedy_metrics(candidate, prompts, [r.continuation for r in refs], thresholds.max_new_tokens)
    metrics.update(greedy)
    metrics["tokenizer_parity"] = 1.0 if parity.passed else 0.0
    checks = threshold_checks(metrics, thresholds)
    failures = [describe_failure(c) for c in checks if not c.passed]
    if not parity.passed and parity.first_mismatch is not None:
        failures.append(f"tokenizer_parity: the base serves ids {parity.first_mismatch['served_ids']} where the "
                        f"adapter's run encodes {parity.first_mismatch['training_ids']}")
    return ValidateResult(metrics=metrics, checks=checks, passed=not failures, failures=failures,
                          tokenizer_parity=parity,
                          details={"prompts": len(prompts), "positions": sum(len(r.sequence) for r in refs),
                                   "reference": "base + adapter merged, fp32 (PyTorch eager)",
                                   "greedy_samples": samples})
