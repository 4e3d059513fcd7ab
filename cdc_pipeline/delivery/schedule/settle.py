"""Settling the calls of the window (window.py) whose outcome is known, in order, in one state
transaction: what failed is parked (and what is behind it in its group), the offset moves past the last of
them. The one place that tells a destination that is down from messages that went unanswered beside
acknowledged ones (outage.py), across calls as within one."""

from __future__ import annotations

import time

import psycopg

from cdc_pipeline.core.metrics_registry import BATCH_SECONDS
from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.offset import OffsetKeeper
from cdc_pipeline.delivery.outage import DestinationDown, Liveness, all_down
from cdc_pipeline.delivery.parking import ParkingLot
from cdc_pipeline.delivery.schedule.requests import Stopped
from cdc_pipeline.delivery.schedule.window import CallWindow, Outstanding, Part
from cdc_pipeline.delivery.stats import DeliveryStats


class Settler:
    def __init__(self, sink: str, parking: ParkingLot, offsets: OffsetKeeper, live: Liveness) -> None:
        self.sink = sink
        self.parking = parking
        self.offsets = offsets
        self.live = live  # when the destination last acknowledged something (the window's threads note it)

    def settle(self, conn: psycopg.Connection, stats: DeliveryStats, window: CallWindow, done: list[Outstanding],
               offset: Position) -> Position:
        """Settle `done` (calls in order) and return the offset. A call that failed as a whole (the destination
        down, nothing acknowledged) ends the settling: the calls before it are settled, its error is raised."""
        good: list[tuple[Outstanding, Part]] = []
        error: Exception | None = None
        for o in done:
            try:
                part = o.outcome()
            except Stopped:  # the run stops mid-call: settle what is before it, nothing after it
                window.abandon()
                break
            except Exception as exc:  # noqa: BLE001 - raised once the calls before it are settled
                error = exc
                break
            cause = all_down(part.results)
            # Nothing acknowledged, and nothing since it began (by calls out beside it, once they are back):
            # the destination is down. Else what it sent went unanswered, as a request timing out beside
            # acknowledged ones.
            if cause is not None and self.live.acked_at <= o.began:
                window.wait_out()
                if self.live.acked_at <= o.began:
                    error = part.down or DestinationDown(f"sink {self.sink!r}: nothing acknowledged: {cause}")
                    break
            good.append((o, part))
        delivered = filtered = parked = read = 0
        for o, part in good:
            parked += self.parking.park_failures(conn, part.sent, part.results, part.held, o.call.stage_failed)
            delivered += sum(1 for r in part.results if r is None)
            filtered += o.call.filtered
            read += o.call.read
        if good:
            last = good[-1][0].call
            stats.batches += len(good)
            stats.read += read
            stats.filtered += filtered
            offset = self.offsets.settle(conn, stats, last.last, delivered, filtered, parked, last.last_ts, read)
            now = time.monotonic()
            for o, _ in good:
                BATCH_SECONDS.labels(self.sink).observe(now - o.began)
        if error is not None:
            raise error
        return offset
