"""Outage versus poison: which delivery failures are the destination's (or the state database's) and are
waited for, and which are a message's own and count against its `max_retries`.

* The destination is down when the sink raises `SinkUnavailable`, or when a batch comes back with nothing
  acknowledged and every message that was sent failed with an `Unreachable` error (timeouts, no
  acknowledgement, lost connection, no responders): `DestinationDown`. The engine then keeps its offset,
  parks nothing, and tries again with capped backoff.
* A message the destination rejects (an error that is not `Unreachable`) is that message's failure.
* An `Unreachable` error next to accepted messages is ambiguous (a message the endpoint times out on, or
  the endpoint going down mid-batch): it counts only once the destination has accepted other messages
  since that message's previous attempt, so healthy messages never exhaust their retries in an outage,
  and a poison message still does, as soon as anything else gets through.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import psycopg

from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline.sinks.base import SinkUnavailable, Unreachable

# SQLSTATE classes that heal by themselves: connection exception, insufficient resources, operator
# intervention (shutdown, cancel), system error, transaction rollback.
_TRANSIENT_CLASSES = ("08", "53", "57", "58", "40")


class DestinationDown(SinkUnavailable):
    """Every message of a batch failed with an `Unreachable` error and none was acknowledged."""


def all_down(results: Sequence[str | None]) -> str | None:
    """The first cause when nothing was acknowledged and every message sent failed as `Unreachable`."""
    cause: str | None = None
    for r in results:
        if r is None:
            return None
        if isinstance(r, Unreachable):
            cause = cause or r
        elif r != HELD:
            return None  # rejected by a destination that answered
    return cause


def transient(exc: BaseException) -> bool:
    """A state database error worth waiting out (server restart, lost connection, ...)."""
    if isinstance(exc, SinkUnavailable):
        return True
    if isinstance(exc, psycopg.Error):
        code = exc.sqlstate
        if code:
            return code[:2] in _TRANSIENT_CLASSES
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return False


class Liveness:
    """When the destination last acknowledged something, and when each failing message was last tried."""

    def __init__(self) -> None:
        self.acked_at = 0.0
        self._tried: dict[Position, float] = {}

    def saw(self, results: Sequence[str | None]) -> None:
        if any(r is None for r in results):
            self.acked_at = time.monotonic()

    def counts(self, position: Position, error: str) -> bool:
        """Whether this failure counts against the message (see the module doc)."""
        if not isinstance(error, Unreachable):
            return True
        tried = self._tried.get(position)
        return tried is not None and self.acked_at > tried

    def tried(self, positions: Sequence[Position]) -> None:
        now = time.monotonic()
        for p in positions:
            self._tried[p] = now

    def forget(self, positions: Sequence[Position]) -> None:
        for p in positions:
            self._tried.pop(p, None)
