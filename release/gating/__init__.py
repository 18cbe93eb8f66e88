"""Running gates: the contract, the entry-point plug-in registry, the runner, the reports.

relctl's own gates live in the top-level `gates/` package and are found through entry points like any
third-party gate, so nothing in `release/` imports `gates/`.
"""
