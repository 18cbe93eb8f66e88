"""The server's side of the Runner types: declared with the Backend contract (release/backends/jobs.py) so a
backend plug-in imports nothing from release.serving; re-exported here for the server's own modules."""

from release.backends.jobs import Finished, Job, StopMatcher, deliver, emit_text, sampled

__all__ = ["Finished", "Job", "StopMatcher", "deliver", "emit_text", "sampled"]
