"""Serving memory: the plan (weights + KV cache + workspace + runtime overhead + rollout overlap) for a
package or a config.json on a target, what would fit instead, and measurements to check it against.

plan.py       the formula (Target, ModelSpec, breakdown, max_concurrency, max_context)
verdict.py    make_plan / load_spec: the whole plan with alternatives, as `relctl plan` and the gate show it
shape.py      a config.json's shape, parameter count (active too) and onnxruntime-genai builder layout
families.py   the architectures the plan knows (MoE, MLA, sliding windows, biases); the rest is unsupported
package.py    a built package's initializer bytes, precision, KV dtype and provider
catalogue.py  the GPU catalogue (gpus.json + release.yaml additions)
measure.py    RSS / device memory and cold start, in worker processes (worker.py)
gpu_env.py    one ONNX Runtime build per environment; the CUDA provider really in use
compat.py     the validate stage's estimate from `serving:` (estimate_memory), kept for promote

Nothing is imported here: `relctl plan --help` reads its choices from plan.py and shape.py, and importing
the package must not load onnx (package.py) on the way (tests/cli/test_startup.py).
"""
