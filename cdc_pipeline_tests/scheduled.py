"""A request sink as the engine's calls use it: the scheduler's requests in front (delivery/schedule/requests.py),
so a test hands it a whole batch and gets what the engine's call would, cut to the sink's `batch_size` with up
to its `max_in_flight` out (the destination's deprecated keys, when a test sets them, as config folds them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdc_pipeline.delivery.schedule.requests import Requests
from cdc_pipeline.sinks.base import OutboundMessage
from cdc_pipeline.sinks.request_sink import RequestSink


class Scheduled:
    def __init__(self, sink: Any, batch_size: int | None = None, max_in_flight: int | None = None) -> None:
        assert isinstance(sink, RequestSink)
        self.sink = sink
        declared = sink.limits()
        dest = getattr(sink, "destination", None)
        self.requests = Requests(sink, batch_size or getattr(dest, "batch_size", None) or declared.batch_size or 1,
                                 max_in_flight or getattr(dest, "max_in_flight", None) or declared.max_in_flight)

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        return self.requests.deliver(batch)

    def __enter__(self) -> Scheduled:
        self.sink.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sink.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sink, name)


def scheduled(sink: Any, dest: Any = None) -> Any:
    """`sink` with the scheduler's requests in front, sized by `dest`'s `batch_size` / `max_in_flight` if set."""
    return Scheduled(sink, getattr(dest, "batch_size", None), getattr(dest, "max_in_flight", None))
