"""`relctl canary` through click: exit 0 on a pass, 1 on a failure, 2 on bad usage; JSON on stdout."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from release.cli import cli
from tests.canary.backend import url

QUICK = ["--steps", "30,50", "--step-requests", "60", "--rate", "60"]


def _canary(tmp: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--project-dir", str(tmp), "canary", *args])
    return result.exit_code, result.stdout, result.stderr


def test_identical_endpoints_exit_0_with_json(backend: str, tmp_path: Path) -> None:
    code, out, err = _canary(tmp_path, "--production-url", url(backend, "1"), "--candidate-url", url(backend, "2"),
                             "--json", *QUICK)
    assert code == 0, err
    report = json.loads(out)
    assert report["status"] == "pass" and report["outcome"] == "pass"
    assert [c["weight"] for c in report["checks"]] == [30, 50]
    metric = report["checks"][0]["metrics"][0]
    assert {"statistic", "p_value", "shift", "interval", "bound", "verdict"} <= set(metric)
    assert any(p.endswith("router-records.jsonl") for p in report["evidence"])
    assert any(p.endswith(".png") and Path(p).is_file() for p in report["evidence"])


def test_slow_candidate_exits_1_and_says_why(backend: str, tmp_path: Path) -> None:
    code, out, err = _canary(tmp_path, "--production-url", url(backend, "1"),
                             "--candidate-url", url(backend, "2", 25, 6), "--json", *QUICK)
    assert code == 1
    report = json.loads(out)
    assert report["outcome"] == "fail" and report["rollback_s"] is not None
    assert err.startswith("error: canary fail: step 1")
    assert "hint:" in err


def test_inconclusive_exits_1(backend: str, tmp_path: Path) -> None:
    # 2% for at most a second: the candidate cannot get the 10 samples each metric needs.
    config = tmp_path / "canary.yaml"
    config.write_text("gates:\n  canary:\n    steps: [2]\n    step_timeout_s: 1\n    traffic: {rate: 60}\n")
    code, out, err = _canary(tmp_path, "--production-url", url(backend, "1"), "--candidate-url", url(backend, "2"),
                             "-c", str(config), "--json")
    assert code == 1
    report = json.loads(out)
    assert report["outcome"] == "inconclusive" and "canary inconclusive" in err
    assert all(m["verdict"] == "inconclusive" for m in report["checks"][0]["metrics"] if m["metric"] != "error_rate")


def test_bad_usage_is_one_line_and_exit_2(tmp_path: Path) -> None:
    code, _, err = _canary(tmp_path, "--production-url", "http://127.0.0.1:1")
    assert code == 2 and err.startswith("error: canary: --production-url and --candidate-url go together")
    code, _, err = _canary(tmp_path, "tiny", "--production-url", "http://a", "--candidate-url", "http://b")
    assert code == 2 and "one way" in err
    code, _, err = _canary(tmp_path, "--production-url", "ftp://x", "--candidate-url", "http://127.0.0.1:1")
    assert code == 2 and "not an http(s) URL" in err
    code, _, err = _canary(tmp_path, "--production-url", "http://a", "--candidate-url", "http://b", "--steps", "0,200")
    assert code == 2 and "steps" in err
    (tmp_path / "release.yaml").write_text("gates:\n  canary:\n    metrics:\n      ttft: {critical: true}\n")
    code, _, err = _canary(tmp_path, "--production-url", "http://a", "--candidate-url", "http://b")
    assert code == 2 and err.startswith("error: release.yaml: gates.canary.metrics:") and "unknown" in err
    assert not (tmp_path / ".relctl" / "canary").exists() or not any((tmp_path / ".relctl" / "canary").iterdir())
