"""`relctl bench`: an open-loop load generator for any OpenAI-compatible endpoint.

    arrivals.py  send times planned in advance: Poisson, Gamma (burstiness), constant, or a trace
    dataset.py   prompts and output lengths drawn from a JSONL dataset
    client.py    the asyncio client: dispatch on schedule, stream, time every chunk
    summary.py   TTFT/TPOT/ITL/E2EL percentiles, throughput, goodput, errors, lag; SLO checks
    runner.py    one run, a sweep for the highest rate meeting the SLOs, a side-by-side compare
    plots.py     latency CDFs and latency vs rate (PNG)
"""
