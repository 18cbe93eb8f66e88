"""The fp32 reference's eval scoring (issue 38): batched (a batch of rows per forward) with the same figures
as row by row, and scored once per release: `precision: auto`'s paired eval scores it, the eval gate reuses it
by content digest (release/gating/reference.py), and the cache's log counts one scoring.

On the session's tiny checkpoint (merged beside trained_package) and 12 rows of its eval set.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gates.base import GateContext
from gates.eval import EvalConfig, EvalGate, score_rows
from gates.eval_data import DataRules, load_eval_set
from release.backends.base import Generation, LoadedModel
from release.backends.torch_reference import TorchReference
from release.gating.plugins import run_gate
from release.gating.reference import ReferenceModel, usage

ROWS = 12
CONFIG = {"metrics": ["exact_match", "token_accuracy", "perplexity"],
          "thresholds": {"exact_match": {"threshold": 0.0}}, "margins": {"token_accuracy": 0.05},
          "against": ["reference"]}


class RowByRow:
    """The reference seen without its batched scoring: the row-at-a-time path of score_rows, same model."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.model_dir = model.model_dir

    @property
    def context_length(self) -> int:
        return self.model.context_length

    @property
    def eos_token_ids(self) -> list[int]:
        return self.model.eos_token_ids

    def encode(self, text: str) -> list[int]:
        return self.model.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.model.decode(ids)

    def generate(self, prompt: str, max_new_tokens: int) -> Generation:
        return self.model.generate(prompt, max_new_tokens)

    def generate_ids(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        return self.model.generate_ids(input_ids, max_new_tokens)

    def logits(self, ids: list[int]) -> object:
        return self.model.logits(ids)


@pytest.fixture(scope="module")
def small_set(eval_set: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reference-scoring") / "eval.jsonl"
    path.write_text("".join(eval_set.read_text().splitlines(keepends=True)[:ROWS]))
    return path


@pytest.fixture(scope="module")
def reference(trained_package: Path) -> TorchReference:
    return TorchReference(trained_package.parent / "merged")  # package_checkpoint merged it beside the package


def test_batched_scoring_gives_the_row_by_row_figures(reference: TorchReference, small_set: Path) -> None:
    config = EvalConfig.model_validate(CONFIG)
    rows = load_eval_set(small_set, DataRules()).rows
    batched = score_rows(reference, rows, config, True)
    one_by_one = score_rows(RowByRow(reference), rows, config, True)  # type: ignore[arg-type]
    assert [r.output for r in batched] == [r.output for r in one_by_one]
    for b, s in zip(batched, one_by_one, strict=True):
        assert b.target_hits == s.target_hits
        assert b.target_logprobs == pytest.approx(s.target_logprobs, abs=1e-4)


def test_the_reference_is_scored_once_for_the_search_and_the_eval_gate(
        trained_package: Path, reference: TorchReference, small_set: Path, tmp_path: Path) -> None:
    cache = tmp_path / "reference-cache"
    gate = EvalGate(EvalConfig.model_validate(CONFIG))
    merged = trained_package.parent / "merged"

    def loaded(folder: Path) -> LoadedModel:  # the module's reference, loaded once (the folder is its own)
        assert folder == merged
        return reference

    # precision: auto's paired judge scores the reference first ...
    judging = GateContext("tiny-llm", merged, tmp_path / "precision", None, eval_dataset=small_set)
    judge = gate.paired_judge(judging, ReferenceModel(merged, loaded, cache))
    judge.reference_scores()
    assert judge.reference_reused is False
    # ... and the eval gate, given the release's reference (another object, the same folder), reuses it.
    context = GateContext("tiny-llm", trained_package, tmp_path / "gate", None, eval_dataset=small_set,
                          load_reference=ReferenceModel(merged, loaded, cache))
    result = run_gate(gate, context)
    assert any(c["against"] == "fp32 reference" for c in result.details["paired"]), result.reason
    used = usage(cache)
    assert used is not None and used["scorings"] == 1 and used["reused"] == 1
    assert [u["by"] for u in used["uses"]] == ["precision: auto", "eval gate"]
