#!/usr/bin/env bash
# GPU check of relctl's memory plan: on a host with an NVIDIA GPU (CUDA 12 driver), in under 5 minutes,
# installing only from the package registry (PyPI), build a small random Llama with onnxruntime-genai's
# builder for the cuda provider, measure the device memory of loading it and running full batches
# (nvidia-ml-py, this process only), and print estimate vs measurement as JSON on stdout.
#
#   bash scripts/gpu-check.sh                 # a fresh venv in ${RELCTL_GPU_VENV:-/tmp/relctl-gpu-venv}
#   bash scripts/gpu-check.sh > gpu.json      # progress on stderr, the JSON alone on stdout
#
# The CPU builds of ONNX Runtime and genai (relctl's default dependencies) are not installed here: the
# venv holds only onnxruntime-gpu and onnxruntime-genai-cuda (release.backends.onnxruntime_genai.gpu_env refuses a mix).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RELCTL_GPU_VENV:-/tmp/relctl-gpu-venv}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
log() { echo "gpu-check: $*" >&2; }

command -v nvidia-smi >/dev/null || { echo "error: no nvidia-smi on this host" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >&2

log "installing into $VENV"
python3 -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip >&2
# torch and transformers: the builder reads the checkpoint through them (PyPI's torch is a CUDA build).
"${PIP[@]}" "onnxruntime-gpu[cuda,cudnn]>=1.20" "onnxruntime-genai-cuda>=0.18" "nvidia-ml-py>=12" \
  "onnx>=1.17" "onnx-ir>=1.0" "numpy>=1.26" "psutil>=5.9" "pydantic>=2.6" "pyyaml>=6" "click>=8.1" \
  "rich>=13" "matplotlib>=3.8" "tokenizers>=0.20" "safetensors>=0.4" "torch>=2.4" "transformers>=4.45" >&2
"${PIP[@]}" --no-deps -e . >&2
PY="$VENV/bin/python"
"$PY" -m release.backends.onnxruntime_genai.gpu_env >&2

log "building a random Llama (hidden 512, 8 layers) for cuda at fp16 and int4"
"$PY" - "$WORK" <<'PYEOF' >&2
import sys
from pathlib import Path
from tests.serving.tinymodel import build_hf_model
build_hf_model(Path(sys.argv[1]) / "hf", hidden=512, layers=8)
PYEOF
for p in fp16 int4; do
  "$PY" -m onnxruntime_genai.models.builder -i "$WORK/hf" -o "$WORK/$p" -p "$p" -e cuda -c "$WORK/cache" \
    > "$WORK/build-$p.log" 2>&1 || { tail -20 "$WORK/build-$p.log" >&2; exit 4; }
  cp "$WORK/hf/config.json" "$WORK/$p/config.json"
done

log "measuring"
timeout 200 "$PY" - "$WORK" <<'PYEOF'
import json, sys
from pathlib import Path
from release.memory.measure import measure_run
from release.backends.package_facts import read_package
from release.backends.onnxruntime_genai.plan import ModelSpec, breakdown
from release.backends.planning import Target
from release.backends.shape import shape_from_config

rows = []
for precision in ("fp16", "int4"):
    facts = read_package(Path(sys.argv[1]) / precision)
    spec = ModelSpec(shape_from_config(facts.config), facts.precision, facts.weights_bytes, facts.kv_dtype_bytes,
                     "package")
    for batch, context, prompt in ((1, 512, None), (4, 1024, None), (8, 2048, None), (8, 2048, 16)):
        m = measure_run(facts.model_dir, batch, context, prompt_tokens=prompt, provider="cuda")
        prefill = min(prompt or context - 1, context - 1)
        b = breakdown(spec, Target(memory_gib=80, concurrency=batch, context=context, provider="cuda",
                                   prefill_tokens=prefill, rollout_overlap=False))
        estimate, measured = b.replica, int(m["peak"]) - int(m["start"])
        rows.append({"precision": precision, "concurrency": batch, "context": context, "prefill_tokens": prefill,
                     "weights": b.weights, "kv_cache": b.kv_cache, "workspace": b.workspace,
                     "overhead": b.overhead, "estimate": estimate, "measured_peak": measured,
                     "measured_loaded": int(m["loaded"]) - int(m["start"]),
                     "error": round((estimate - measured) / measured, 4), "load_s": m["load_s"],
                     "ttft_s": m["ttft_s"]})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
errors = [abs(r["error"]) for r in rows]
print(json.dumps({"check": "gpu-memory", "rows": rows, "max_abs_error": max(errors),
                  "target_max_abs_error": 0.10, "within_target": max(errors) <= 0.10}, indent=2))
PYEOF
