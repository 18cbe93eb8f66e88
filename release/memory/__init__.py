"""Serving memory, engine-agnostic: the GPU catalogue, the memory gate's settings, `relctl plan`, and the
measurements a plan is checked against. Each engine's plan is its backend's (`Backend.plan`, the
`EnginePlan` contract in release/backends/planning.py); nothing here knows an engine.

catalogue.py  the GPU catalogue (gpus.json + release.yaml additions)
settings.py   gates.memory: the target, each engine's plan options, the cold-start bound
cli.py        relctl plan: any installed backend's plan of a package or a config.json
measure.py    RSS / device memory and cold start, in worker processes (worker.py)

Nothing is imported here: importing the package must not load an engine on the way
(tests/cli/test_startup.py).
"""
