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

import logging
import threading
import time
from collections.abc import Callable, Sequence

import psycopg

from cdc_pipeline.core.backoff import next_delay_ms
from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline.delivery.stats import DeliveryStats
from cdc_pipeline.sinks.base import SinkUnavailable, Unreachable
from cdc_pipeline.state.base import StateError

log = logging.getLogger("cdc_pipeline.delivery.engine")  # the delivery's own log, as its other parts

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


def ride_through(session: Callable[[bool], None], stats: DeliveryStats, name: str, retry_ms: tuple[int, int],
                 stop: threading.Event, deadline: float | None, one_off: bool,
                 record: Callable[[str | None], None], also: tuple[type[Exception], ...] = ()) -> None:
    """Run ``session(first)`` until it returns, riding through outages: a `transient` failure of the
    destination or the state database (or one of ``also``) is waited for with capped backoff (``retry_ms``:
    initial, max; from the first again once a session made progress), logged and recorded for `status`
    (``record``); the next session resumes from the committed offset. Anything else, or any failure of a
    ``one_off`` run (a catch-up), is raised. Waiting ends at ``deadline`` or a stop."""
    attempt = 0
    first = True
    try:
        while not stop.is_set():
            before = (stats.delivered, stats.parked, stats.retried)
            try:
                session(first)
                return
            except Exception as caught:
                # A state database error that came through the sink's code is the state database's.
                exc = caught.__cause__ if isinstance(caught, StateError) and caught.__cause__ else caught
                if one_off or not (transient(exc) or isinstance(exc, also)):
                    if exc is caught:
                        raise
                    raise exc from None
            first = False
            progressed = (stats.delivered, stats.parked, stats.retried) != before
            attempt = 1 if progressed else attempt + 1
            delay = next_delay_ms(attempt, *retry_ms) / 1000
            cause = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
            stats.outage_retries += 1
            stats.waiting = cause
            what = "the state database" if isinstance(exc, psycopg.Error) else "the destination"
            log.warning("deliver: sink %s: waiting for %s: %s; retry %d in %.1f s", name, what, cause, attempt, delay)
            record(cause)
            if deadline is not None and time.monotonic() + delay >= deadline:
                break  # a time-limited run ends waiting; the next one starts over
            if stop.wait(delay):
                break
    finally:
        if stats.outage_retries:
            record(None)
