"""Prometheus metrics of one server, in their own registry (no process-global state)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class Identity:
    """What every response names: the registered model, its version and the serving-config hash."""

    name: str
    version: str
    serving_config: str

    @property
    def model_id(self) -> str:
        return f"{self.name}:{self.version}"

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [
            (b"x-relctl-model", self.name.encode()),
            (b"x-relctl-version", self.version.encode()),
            (b"x-relctl-serving-config", self.serving_config.encode()),
        ]


class ServerMetrics:
    def __init__(self, identity: Identity, load_time_s: float, queue_depth: Callable[[], int],
                 in_flight: Callable[[], int], batching: Callable[[], dict[str, Any]] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("relctl_requests", "Requests answered", ["endpoint", "code"], registry=r)
        self.errors = Counter("relctl_errors", "Server faults: generation failed or the handler raised",
                              ["kind"], registry=r)
        self.rejected = Counter("relctl_rejected", "Requests refused before generation", ["reason"], registry=r)
        self.ttft = Histogram("relctl_time_to_first_token_seconds", "Arrival to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("relctl_request_duration_seconds", "Arrival to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("relctl_queue_wait_seconds", "Admission to generation start",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("relctl_prompt_tokens", "Prompt tokens processed", registry=r)
        self.output_tokens = Counter("relctl_output_tokens", "Tokens generated", registry=r)
        Gauge("relctl_queue_depth", "Admitted requests waiting for a worker", registry=r).set_function(
            lambda: float(queue_depth())
        )
        Gauge("relctl_in_flight", "Admitted requests (waiting or generating)", registry=r).set_function(
            lambda: float(in_flight())
        )
        Gauge("relctl_model_load_seconds", "Time to load the model", registry=r).set(load_time_s)
        if batching is not None:
            stats = batching
            Gauge("relctl_max_batch_size", "Requests one model step can run (1: thread pool, no batching)",
                  registry=r).set_function(lambda: float(stats()["max_batch_size"]))
            Gauge("relctl_batch_resident", "Requests in the batching engine now", registry=r).set_function(
                lambda: float(stats().get("resident", 0)))
            Gauge("relctl_batch_steps", "Batched model steps run (monotonic)", registry=r).set_function(
                lambda: float(stats().get("steps", 0)))
            Gauge("relctl_batch_mean_size", "Mean requests per batched model step", registry=r).set_function(
                lambda: float(stats().get("mean_batch", 0.0)))
        info = Gauge("relctl_model_info", "The served version", ["model", "version", "serving_config"], registry=r)
        info.labels(identity.name, identity.version, identity.serving_config).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
