"""The tail of every send: the sink's offset advanced with its counts, a recorded wait for the destination
cleared, the state transaction committed, the run's figures updated; and that wait recorded (for `status`)
while a long-running delivery rides through an outage. One place, so a live batch, a relayed run of typed
reads and whatever sends next settle the same way."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

import psycopg

from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.stats import DeliveryStats
from cdc_pipeline.postgres import session
from cdc_pipeline.sinks.base import OwnPosition
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline.state.sink_offsets import SinkOffsets

log = logging.getLogger("cdc_pipeline.delivery.engine")


class OffsetKeeper:
    def __init__(self, offsets: SinkOffsets, change_log: ChangeLog, state_dsn: str, sink: str, lane: int = 0) -> None:
        self.offsets = offsets
        self.change_log = change_log  # counts what the destination committed before we did
        self.state_dsn = state_dsn
        self.sink = sink
        self.lane = lane
        self.waiting = False  # a wait for the destination is recorded in the state database

    def start(self, conn: psycopg.Connection, tables: Sequence[str], own: OwnPosition | None, key: str) -> Position:
        """A session's offset: the recorded one, or the position the destination committed itself (its sink's
        ``own`` record, under ``key``) when it is further (the sink committed before we did: recorded now). Commits."""
        offset = self.offsets.sink_offset(conn, self.sink, self.lane)
        held = own.read(key) if own is not None else None
        if held is not None and held > offset:
            done = self.change_log.count_after(conn, tables, offset, sink=self.sink, upto=held)
            self.offsets.advance_offset(conn, self.sink, held, done, 0, 0, None, self.lane)
            offset = held
        conn.commit()
        return offset

    def settle(self, conn: psycopg.Connection, stats: DeliveryStats, last: Position, delivered: int,
               filtered: int, parked: int, last_ts: datetime | None, read: int = 0) -> Position:
        """Everything up to ``last`` is delivered, filtered out or parked: the offset moves past it (``read``:
        the log rows read to get there, for `status`)."""
        self.offsets.advance_offset(conn, self.sink, last, delivered, filtered, parked, last_ts, self.lane, read)
        if self.waiting:
            self.offsets.set_waiting(conn, self.sink, None, self.lane)
            self.waiting = False
        conn.commit()
        stats.delivered += delivered
        stats.parked += parked
        return last

    def record_waiting(self, reason: str | None) -> None:
        """Best effort, on its own connection: the state database may be what is down."""
        try:
            with session.connect(self.state_dsn, autocommit=True, statement_timeout_ms=5000) as conn:
                self.offsets.set_waiting(conn, self.sink, reason, self.lane)
        except psycopg.Error as exc:
            log.debug("deliver: sink %s: cannot record waiting: %s", self.sink, type(exc).__name__)
        self.waiting = reason is not None
