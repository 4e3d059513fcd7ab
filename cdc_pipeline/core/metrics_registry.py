"""This process's Prometheus registry and the instruments recorded where the work happens (delivery), below
ops/metrics.py, which serves them with the collectors of the pipeline's state."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)  # this process's; Python's own metrics stay out
BATCH_SECONDS = Histogram("cdc_sink_batch_duration_seconds", "Time to send one batch and record its offset",
                          ["sink"], registry=REGISTRY,
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
