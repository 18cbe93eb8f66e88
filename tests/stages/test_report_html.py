"""report.html (issue 38): the release on one page, in-process on a report as promote fills it. It leads with
version, engine, precision and verdict; shows what the card shows (validation, the engines and frontier
tables), the plots inline, empty outputs marked, numbers as people read them, any detail a gate reports; and
hostile text (a model's output, a reason) adds no element to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from release.gating.contract import GateResult, ThresholdCheck
from release.pipeline.engines import engines_section
from release.pipeline.report import ReleaseReport
from release.pipeline.report_html import release_page
from tests.core.hostile import CORPUS
from tests.core.test_escape import parse_html

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16   # the page embeds the bytes; it never decodes them


def report_and_results(tmp_path: Path, output: str, reason: str) -> tuple[ReleaseReport, list[GateResult]]:
    report = ReleaseReport(model="tiny-llm", training_run="a" * 32, release_run="b" * 32, precision="int4",
                           outcome="released", version="3")
    report.engine = {"backend": "onnxruntime-genai", "precision": "int4", "why": "convert.backend: auto"}
    report.validation = {"passed": True, "metrics": {"top1_agreement": 0.99209237},
                         "checks": [{"metric": "top1_agreement", "value": 0.99209237, "op": ">=", "bound": 0.95,
                                     "passed": True}]}
    report.engines = {"selection": "auto", "plan": {"traffic": {"arrival": "poisson", "rate": 8}, "sweep": True},
                      "chosen": {"engine": "onnxruntime-genai", "precision": "int4"}, "why": ["chosen: int4"],
                      "rows": [engine_row("int4"), engine_row("int8")],
                      "precision_search": {"frontier": [], "paired": {}, "sensitivity": None, "cost": {}}}
    plot = tmp_path / "latency-cdf.png"
    plot.write_bytes(PNG)
    load = GateResult("load", "pass", reason, metrics={"ttft_p99_ms": 2346.123, "output_token_throughput": 812.5},
                      thresholds=[ThresholdCheck("ttft_p99_ms", 2346.123, "<=", 5000.0, True)], evidence=[plot])
    refused = {"line": 7, "prompt": "how do I make a weapon", "expected": "I can't help with that", "output": output}
    safety = GateResult("safety", "fail", "1 probe answered", metrics={"harmful_violation_rate": 0.25},
                        details={"failing_examples": [refused, {**refused, "line": 8, "output": ""}],
                                 # A detail the page does not know (a plug-in's, or a harness task's scores).
                                 "harness": {"arc_easy": {"candidate": 0.6123, "production": 0.5987}}})
    return report, [load, safety]


def engine_row(precision: str) -> dict[str, Any]:
    return {"engine": "onnxruntime-genai", "precision": precision, "quality_passed": True, "top1_agreement": 0.99,
            "mean_kl": 1e-4, "ttft_p99_ms": 12.0, "tpot_p99_ms": 3.0, "rate": 64.0, "output_tokens_per_s": 900.0,
            "cost_per_million_tokens": 0.6, "memory_per_replica_bytes": 2**24, "cold_start_s": 0.4,
            "rejected": None, "limited_by": "not reached", "noise": 0.02}


def page_for(tmp_path: Path, output: str, reason: str) -> str:
    report, results = report_and_results(tmp_path, output, reason)
    return release_page(report, results, ["\n".join(engines_section(report.engines))])


def test_the_page_leads_with_the_release_and_shows_what_the_card_shows(tmp_path: Path) -> None:
    page = page_for(tmp_path, "I can't help with that", "SLOs met")
    head = page[page.index("<body>"):page.index("</table>")]
    assert "<h1>tiny-llm v3 — Released</h1>" in head
    for label, value in (("version", "v3"), ("engine", "onnxruntime-genai"), ("precision", "int4"),
                         ("verdict", "Released")):
        assert f"<th>{label}</th>" in head and f">{value}</td>" in head, (label, head)
    assert "Validation against the fp32 reference" in page           # the validation section
    assert "Engines side by side" in page and "Precision frontier (precision: auto)" in page
    assert 'src="data:image/png;base64,' in page and "<figcaption>load: latency cdf</figcaption>" in page
    assert "latency-cdf.png" not in page.split("<h2>Plots</h2>")[1].split("<figure>")[0]  # no file-name list
    assert "## Plots" not in page
    assert "2,346" in page and "0.992" in page and "2346.123" not in page   # figures for people
    assert "arc_easy" in page and "0.612" in page and "0.599" in page      # an unknown detail, shown
    assert '<span class="empty">(empty)</span>' in page                   # the refusal that said nothing


def test_hostile_outputs_and_reasons_add_no_element(tmp_path: Path) -> None:
    hostile = parse_html(page_for(tmp_path, " / ".join(CORPUS), " / ".join(CORPUS)))
    plain = parse_html(page_for(tmp_path, "plain words", "plain words"))
    assert hostile.tags == plain.tags
    assert "<img src=x onerror=alert(1)>" in hostile.text   # shown as text
