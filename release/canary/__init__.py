"""The canary: the candidate serves a share of live traffic beside production; a statistical judge decides.

    judge.py     pure statistics: Mann-Whitney U + Hodges-Lehmann interval, proportions, step scores
    settings.py  the `gates.canary` block of release.yaml (also what `relctl canary` runs with)
    traffic.py   the open-loop traffic driver (the load generator's arrivals and dataset, plus answers)
    sources.py   where a step's samples come from: the router's records, or a Prometheus query API
    runner.py    router + steps + checks + rollback, one canary run
    outcome.py   the alias moves at the end of a canary (pass, fail, stopped)
    plots.py     per-step latency CDFs of both sides (PNG)
    kserve.py    a KServe InferenceService with canaryTrafficPercent for the candidate
    cli.py       `relctl canary`
The router itself lives with the rest of serving: release/serving/router.py.
"""
