"""MLflow registry webhooks: the signed-delivery receiver (receiver.py) and `relctl webhook` (cli.py)."""
