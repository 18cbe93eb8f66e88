"""Serving: the local OpenAI-compatible server on onnxruntime-genai and the open-loop load generator.

    settings.py   ServerSettings: limits, admission queue, timeouts, request-log retention
    engine.py     the model and a fixed pool of generator threads behind admission control
    protocol.py   OpenAI request schemas (400 naming the field) and response bodies
    app.py        the starlette app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics
    server.py     run the app with uvicorn (graceful shutdown) in the foreground or as a child process
    source.py     `<model>@<alias>` or a package folder -> a verified package
    loadgen/      `relctl bench`: arrivals, dataset, client, metrics, sweep, compare, plots
    cli.py        the click commands `serve` and `bench`
"""
