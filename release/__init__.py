"""relctl: turn an MLflow training run into a gated, rollback-able serving version."""

__version__ = "0.1.0"
