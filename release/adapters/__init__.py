"""Adapters as release units: a LoRA released onto the base version that already serves, proven to match it
by content digest, registered as its own model version linked to that base (docs/adapters.md)."""
