"""lm-eval's `local-completions` against `relctl serve` (the eval gate's harness runner, gates/harness/) scores a
local multiple-choice task with the log-likelihoods lm-eval's own PyTorch model (`hf`, transformers fp32) gives
the same task: every choice of every document within 1e-5. No hub: the task and its data are local files."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from gates.harness.config import HarnessTask
from gates.harness.run import run_tasks

TASK = "reverse_mc"
TOLERANCE = 1e-5
TASK_YAML = """task: reverse_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: data/reverse.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{prompt}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1
"""


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


def write_task(folder: Path, eval_jsonl: Path, rows: int = 12) -> Path:
    """A multiple-choice task from the example's held-out reversal rows: the reversal, the sequence as given
    and a shuffle; its data file is named relative to the YAML."""
    rng = random.Random(0)
    lines = [json.loads(line) for line in eval_jsonl.read_text().splitlines()]
    docs = []
    for row in [r for r in lines if r["prompt"].startswith("reverse")][:rows]:
        letters = row["prompt"].split()[1:-1]
        shuffled = letters[:]
        rng.shuffle(shuffled)
        docs.append({"prompt": row["prompt"], "choices": [row["expected"], " ".join(letters), " ".join(shuffled)],
                     "answer": 0})
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "reverse.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / f"{TASK}.yaml").write_text(TASK_YAML)
    return folder


def reference_loglikelihoods(checkpoint: Path, tasks: Path) -> dict[str, list[float]]:
    """The same task scored by lm-eval's PyTorch model on the fp32 checkpoint (BOS added like the server)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from gates.harness.lm_eval import resolve_task

    resolved, problems = resolve_task(HarnessTask(harness="lm-eval", task=TASK, include_path=tasks), TASK, None)
    assert resolved is not None and resolved.config is not None and not problems
    results: Any = lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": str(checkpoint), "dtype": "float32", "device": "cpu",
                                "add_bos_token": True},
        tasks=[resolved.config], task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        log_samples=True, batch_size=1)
    return {str(s["doc_id"]): [r[0] for r in s["filtered_resps"]] for s in results["samples"][TASK]}


def test_served_log_likelihoods_equal_the_pytorch_reference(trained_package: Path, tiny_base_only: Path,
                                                            tiny_data: Path, tmp_path: Path) -> None:
    tasks = write_task(tmp_path / "tasks", tiny_data / "eval.jsonl")
    entry = HarnessTask(harness="lm-eval", task=TASK, include_path=tasks)
    results = run_tasks([entry], trained_package, None, tmp_path / "harness", None)
    (run,) = results.candidate
    served = {doc: [pair[0] for pair in answer] for doc, answer in run.responses[TASK].items()}
    reference = reference_loglikelihoods(tiny_base_only, tasks)

    assert sorted(served, key=int) == sorted(reference, key=int) == [str(i) for i in range(12)]
    worst = max(abs(a - b) for doc in served for a, b in zip(served[doc], reference[doc], strict=True))
    print(f"max |delta log-likelihood| served vs PyTorch: {worst:.3g}")
    assert worst < TOLERANCE
    # Per-sample scores for the paired comparison, by lm-eval's doc ids; the package records what ran.
    by_metric = {s.metric: s for s in run.scores}
    acc = by_metric[f"lm_eval/{TASK}/acc"]
    assert acc.kind == "binary" and acc.ids == tuple(sorted(served, key=int)) and acc.mean > 0.5
    # The task's own score beside production's (none here), as the gate's line, card and summary show it.
    shown = {s["metric"]: s for s in results.task_scores()}
    assert shown["acc"]["candidate"] == acc.mean and shown["acc"]["production"] is None and shown["acc"]["own"]
    target = by_metric[f"lm_eval/{TASK}/target_loglikelihood"]
    assert target.kind == "continuous"
    assert all(abs(v - reference[i][0]) < TOLERANCE for i, v in zip(target.ids, target.values, strict=True))
    record = run.record()
    assert record["harness"] == "lm-eval" and record["version"] == "0.4.13" and record["tasks"] == [TASK]
    assert set(record["digests"]) == {str(tasks / f"{TASK}.yaml"), str(tasks / "data" / "reverse.jsonl")}
    assert record["config"]["task"][TASK]["output_type"] == "multiple_choice"
    lines = [json.loads(line) for line in results.samples_file.read_text().splitlines()]
    assert sum(1 for line in lines if line.get("metric") == acc.metric) == 12


INSPECT_TASK = '''from inspect_ai import Task, task
from inspect_ai.dataset import json_dataset
from inspect_ai.scorer import includes
from inspect_ai.solver import generate


@task
def probe() -> Task:
    return Task(dataset=json_dataset("probe.jsonl"), solver=generate(), scorer=includes())
'''


def test_an_inspect_task_is_scored_per_sample_through_the_server(trained_package: Path, tmp_path: Path) -> None:
    """Inspect's openai-api provider against relctl serve's chat API: each sample's score by its dataset id.
    Any answer includes the empty target and none includes the other, so the values pin the id mapping."""
    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "probe.py").write_text(INSPECT_TASK)
    rows = [{"id": "always", "input": "reverse a b ->", "target": ""},
            {"id": "never", "input": "reverse c d ->", "target": "\u2603 not an answer \u2603"}]
    (evals / "probe.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = HarnessTask(harness="inspect", file=Path("evals/probe.py"), task="probe")
    results = run_tasks([entry], trained_package, None, tmp_path / "harness", tmp_path)
    (run,) = results.candidate
    (scores,) = run.scores
    assert scores.metric == "inspect/probe/includes" and scores.kind == "binary"
    assert dict(zip(scores.ids, scores.values, strict=True)) == {"always": 1.0, "never": 0.0}
    record = run.record()
    assert record["harness"] == "inspect" and record["version"] and record["config"]["temperature"] == 0.0
    assert set(record["digests"]) == {str(evals / "probe.py"), str(evals / "probe.jsonl")}
