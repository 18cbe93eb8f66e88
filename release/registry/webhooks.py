"""The header names MLflow signs its webhook deliveries with (mlflow/webhooks/constants.py), re-exported so
the receiver (release/webhook/receiver.py) reads MLflow's own names without importing MLflow itself: a rename in
MLflow still breaks here, loudly."""

from __future__ import annotations

from mlflow.webhooks.constants import (
    WEBHOOK_DELIVERY_ID_HEADER,
    WEBHOOK_SIGNATURE_HEADER,
    WEBHOOK_SIGNATURE_VERSION,
    WEBHOOK_TIMESTAMP_HEADER,
)

__all__ = ["WEBHOOK_DELIVERY_ID_HEADER", "WEBHOOK_SIGNATURE_HEADER", "WEBHOOK_SIGNATURE_VERSION",
           "WEBHOOK_TIMESTAMP_HEADER"]
