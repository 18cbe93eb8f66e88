"""The release pipeline: promote's phases, the stage runner with resume, the run contract, the release
report, lineage, fetching released packages, and the one error policy."""
