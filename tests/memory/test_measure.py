"""The estimate against a real CPU measurement (RSS growth over the loaded model), cold start, and the refusal
of an environment holding both ONNX Runtime builds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from release.backends.onnxruntime_genai.gpu_env import check_ort_builds
from release.backends.onnxruntime_genai.plan import ModelSpec, Target, breakdown
from release.backends.package_facts import read_package
from release.backends.shape import shape_from_config
from release.core.errors import InputError
from release.memory.measure import measure_cold_starts, measure_run

# benchmarks/memory.py measured -10% .. +4% on prefill rows and -68% .. -2% on decode rows (at most 13 MiB);
# the test allows a generous 50% so a busy machine does not flake, and still fails a wrong formula (the KV
# term alone is off by 2x or more for a wrong layout, dtype or allocation rule).
BOUND = 0.5


@pytest.mark.parametrize(("concurrency", "context", "prompt"), [(4, 256, None), (8, 512, 16)])
def test_cpu_measurement_matches_the_estimate(built: dict[str, Path], concurrency: int, context: int,
                                              prompt: int | None) -> None:
    facts = read_package(built["fp32"])
    measured = measure_run(facts.model_dir, concurrency, context, prompt_tokens=prompt)
    spec = ModelSpec(shape_from_config(facts.config), "fp32", facts.weights_bytes, facts.kv_dtype_bytes, "package")
    prefill = prompt or context - 1
    plan = breakdown(spec, Target(memory_gib=8, concurrency=concurrency, context=context, provider="cpu",
                                  prefill_tokens=prefill, rollout_overlap=False))
    estimate = plan.kv_cache + plan.workspace
    growth = int(measured["growth"])
    assert measured["peak_source"] == "VmHWM"
    assert abs(estimate - growth) / growth <= BOUND, (estimate, growth)
    assert growth > plan.kv_cache  # the whole context's KV really became resident


def test_cold_start_is_measured_in_fresh_processes(built: dict[str, Path]) -> None:
    (cold,) = measure_cold_starts([read_package(built["int4"]).model_dir], repeats=2)
    assert len(cold.samples) == 2 and 0 < cold.load_s < 60 and 0 < cold.ttft_s < 60
    assert cold.total_s == cold.load_s + cold.ttft_s


def _fake_gpu_build(root: Path) -> Path:
    # A real distribution record, as pip would leave it, for a second ONNX Runtime build.
    info = root / "onnxruntime_gpu-1.20.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 1.20.0\n")
    return root


def test_both_ort_builds_in_one_environment_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_ort_builds()  # this environment holds the CPU build only
    monkeypatch.syspath_prepend(str(_fake_gpu_build(tmp_path)))
    with pytest.raises(InputError, match=r"both onnxruntime .* and onnxruntime-gpu 1\.20\.0"):
        check_ort_builds()


def test_the_environment_check_exits_2_with_one_line(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]  # this checkout's release/, behind the fake build
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_fake_gpu_build(tmp_path)), str(root)])}
    done = subprocess.run([sys.executable, "-m", "release.backends.onnxruntime_genai.gpu_env"], capture_output=True,
                          text=True, env=env, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 2
    assert lines[0].startswith("error: environment holds both onnxruntime")
    assert lines[1].startswith("hint: pip uninstall")
