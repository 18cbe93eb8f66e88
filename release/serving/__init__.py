"""Serving: the local OpenAI-compatible server (any backend's Runner behind relctl's admission) and the
open-loop load generator.

    settings.py   ServerSettings: limits, admission queue, timeouts, request-log retention
    engine.py     the model behind admission control: the runner's BatchEngine or a pool of generator threads;
                  jobs.py: what the threads hand back (declared with the Backend contract, backends/jobs.py)
    protocol.py   OpenAI request schemas, the model's limits (400 naming the field) and response bodies
    parsing.py    bounded JSON decoding, unsupported OpenAI fields refused by name
    app.py        the starlette app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics,
                  /openapi.json (openapi.py), optional Bearer key; runs.py: one request's response
    server.py     run the app with uvicorn (graceful shutdown) in the foreground or as a child process
    source.py     a package folder, MODEL@ALIAS, MODEL/VERSION or models:/... -> a verified package
    loadgen/      `relctl bench`: arrivals, dataset, client, metrics, sweep, compare, plots
    cli.py        the click commands `serve` and `bench`
"""
