"""`relctl bench`: an open-loop load generator for any OpenAI-compatible endpoint.

    arrivals.py  send times planned in advance: Poisson, Gamma (burstiness), constant, or a trace
    traces.py    trace formats: relctl/Mooncake JSONL, serve request logs, bench/router records, Azure CSV
    dataset.py   prompts and output lengths drawn from a JSONL dataset, or synthetic ones
    context.py   /v1/models: model id and max_model_len; requests fitted to the context
    client.py    dispatch on schedule (timer.py: timerfd wake-ups), stream, time every chunk
    http1.py     the lean HTTP/1.1 keep-alive client the dispatcher writes requests with
    summary.py   TTFT/TPOT/ITL/E2EL percentiles, throughput, goodput, errors, lag; SLO checks
    runner.py    one run, a sweep for the highest rate meeting the SLOs, a side-by-side compare
    segments.py  one plan split across hosts (--segment i/N) and merged back (bench merge)
    jobs.py      the Kubernetes indexed Job that runs the segments (templates/k8s-bench-job.yaml)
    bench.py     run_bench() and merge_segments(): records, summary.json and plots in a folder
    cli.py       `relctl bench [run] URL` and `relctl bench merge DIR...`
    plots.py     latency CDFs and latency vs rate (PNG)
"""
