"""The `sink_offsets` table: how far each sink has delivered the log, what it counted, and whether it waits."""

from __future__ import annotations

from datetime import datetime

import psycopg
from psycopg import sql

from cdc_pipeline.state.base import Position, SchemaStore


class SinkOffsets(SchemaStore):
    """One row per sink and lane (core/lanes.py; a sink without lanes is lane 0)."""

    def sink_offset(self, conn: psycopg.Connection, sink: str, lane: int = 0) -> Position:
        """The lane's offset; a lane seen for the first time gets its row, at the start of the log."""
        conn.execute(sql.SQL("INSERT INTO {}.sink_offsets (sink, lane) VALUES (%s, %s) ON CONFLICT DO NOTHING")
                     .format(self.s), (sink, lane))
        row = conn.execute(sql.SQL("SELECT commit_lsn, commit_idx FROM {}.sink_offsets WHERE sink = %s AND lane = %s")
                           .format(self.s), (sink, lane)).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def delivered_total(self, conn: psycopg.Connection, sink: str) -> int:
        row = conn.execute(sql.SQL("SELECT sum(delivered) FROM {}.sink_offsets WHERE sink = %s").format(self.s),
                           (sink,)).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def advance_offset(self, conn: psycopg.Connection, sink: str, position: Position, delivered: int,
                       filtered: int, parked: int, last_commit_ts: datetime | None, lane: int = 0,
                       read: int = 0) -> None:
        """Move the offset to ``position`` (never back) and add to the sink's counts (``read``: the log rows the
        lane read to get there)."""
        conn.execute(sql.SQL(
            "UPDATE {}.sink_offsets SET commit_lsn = %s, commit_idx = %s, delivered = delivered + %s, "
            "filtered = filtered + %s, parked = parked + %s, rows_read = rows_read + %s, "
            "last_commit_ts = coalesce(%s, last_commit_ts), updated_at = now() "
            "WHERE sink = %s AND lane = %s AND (commit_lsn, commit_idx) <= (%s, %s)").format(self.s),
            (position[0], position[1], delivered, filtered, parked, read, last_commit_ts, sink, lane, *position))

    def set_waiting(self, conn: psycopg.Connection, sink: str, reason: str | None, lane: int = 0) -> None:
        """Record that the lane's delivery waits for its destination (reason None: it no longer does)."""
        conn.execute(sql.SQL(
            "UPDATE {}.sink_offsets SET waiting_reason = %s, waiting_since = CASE WHEN %s::text IS NULL THEN NULL "
            "ELSE coalesce(waiting_since, now()) END WHERE sink = %s AND lane = %s").format(self.s),
            (reason, reason, sink, lane))
