"""Standard eval harnesses run through the served model: lm-evaluation-harness tasks (by name from an
include path, or a team's task YAML) and Inspect AI task files, scored against `relctl serve` of the
candidate and of production, each sample's score kept (gates.samples.SampleScores) for the paired comparison.

- config.py: the `gates.eval.tasks` entries and their preflight (`relctl check`: every problem at once);
- lm_eval.py: resolve an lm-eval task, run it with `local-completions`, per-document scores;
- inspect.py: resolve an Inspect task, run it against the server's OpenAI-compatible API, per-sample scores;
- run.py: serve each package once and run every task through it.
"""
