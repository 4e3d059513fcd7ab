"""This process's Prometheus registry and the instruments recorded where the work happens (delivery, the
pull API), below ops/metrics.py, which serves them with the collectors of the pipeline's state."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)  # this process's; Python's own metrics stay out
BATCH_SECONDS = Histogram("cdc_sink_batch_duration_seconds", "Time to send one batch and record its offset",
                          ["sink"], registry=REGISTRY,
                          buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
# Sinks that send requests one by one through a window (the webhook): each request's time, and how many are out.
REQUEST_SECONDS = Histogram("cdc_sink_request_duration_seconds", "Time from sending one request to its answer",
                            ["sink"], registry=REGISTRY,
                            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
REQUESTS_IN_FLIGHT = Gauge("cdc_sink_requests_in_flight", "Requests sent and not answered yet", ["sink"],
                           registry=REGISTRY)
# The pull API (`serve`): a receive's time includes its long-poll wait, so `result` tells the answers that
# carried messages (the latency a consumer sees for work) from the empty ones (mostly wait_for_ms).
PULL_RECEIVE_SECONDS = Histogram("cdc_pull_receive_duration_seconds", "Time to answer one receive request",
                                 ["sink", "result"], registry=REGISTRY,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                                          30, 60))
PULL_MESSAGES = Counter("cdc_pull_messages", "Messages handed out, acknowledged or released by this server",
                        ["sink", "operation"], registry=REGISTRY)  # operation: received | acked | nacked
