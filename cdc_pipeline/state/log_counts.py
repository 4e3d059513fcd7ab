"""The change log's positions and counts, SQL alone (no Arrow): what flow control, status and lag ask of it.
A sink sees its tables' changes and the backfill reads meant for it (``routing``); change_log.py loads them."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from cdc_pipeline.core.positions import END, START
from cdc_pipeline.state.base import Position, SchemaStore


def sink_params(sink: str | None) -> tuple[str, ...]:
    """The routing condition's parameter: the sink's name, when the query routes."""
    return () if sink is None else (sink,)


class LogCounts(SchemaStore):
    def routing(self, sink: str | None) -> sql.Composable:
        """Backfill reads reach only the sinks their backfill targets; changes reach every sink. A condition
        on the sink's name (a parameter, after the tables'), to go after a WHERE."""
        if sink is None:
            return sql.SQL("")
        return sql.SQL("AND (backfill_id IS NULL OR backfill_id IN "
                       "(SELECT id FROM {}.backfills WHERE %s = ANY(sinks))) ").format(self.s)

    def log_head(self, conn: psycopg.Connection, tables: Sequence[str], sink: str | None = None) -> Position:
        row = conn.execute(sql.SQL(
            "SELECT commit_lsn, commit_idx FROM {}.change_log WHERE table_schema || '.' || table_name = ANY(%s) "
            "{routing}ORDER BY commit_lsn DESC, commit_idx DESC LIMIT 1").format(self.s, routing=self.routing(sink)),
            (list(tables), *sink_params(sink))).fetchone()
        return (int(row[0]), int(row[1])) if row else START

    def count_after(self, conn: psycopg.Connection, tables: Sequence[str], after: Position,
                    sink: str | None = None, upto: Position | None = None) -> int:
        """A sink's messages after ``after`` (and up to ``upto``, when given)."""
        last = upto or END
        row = conn.execute(sql.SQL(
            "SELECT count(*) FROM {}.change_log WHERE (commit_lsn, commit_idx) > (%s, %s) "
            "AND (commit_lsn, commit_idx) <= (%s, %s) "
            "AND table_schema || '.' || table_name = ANY(%s) {routing}").format(self.s, routing=self.routing(sink)),
            (after[0], after[1], last[0], last[1], list(tables), *sink_params(sink))).fetchone()
        return int(row[0]) if row else 0

    def backlog(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, sink: str, limit: int) -> int:
        """Like count_after, but stops counting at ``limit`` (cheap enough to ask often)."""
        row = conn.execute(sql.SQL(
            "SELECT count(*) FROM (SELECT 1 FROM {}.change_log WHERE (commit_lsn, commit_idx) > (%s, %s) "
            "AND table_schema || '.' || table_name = ANY(%s) {routing}LIMIT %s) t").format(
                self.s, routing=self.routing(sink)),
            (after[0], after[1], list(tables), *sink_params(sink), limit)).fetchone()
        return int(row[0]) if row else 0

    def oldest_age(self, conn: psycopg.Connection, tables: Sequence[str], after: Position,
                   sink: str | None = None) -> float | None:
        """Seconds since the commit of the first message after ``after`` (a sink's lag), None if none."""
        row = conn.execute(sql.SQL(
            "SELECT extract(epoch FROM now() - commit_ts)::float8 FROM {}.change_log "
            "WHERE (commit_lsn, commit_idx) > (%s, %s) AND table_schema || '.' || table_name = ANY(%s) "
            "{routing}ORDER BY commit_lsn, commit_idx LIMIT 1").format(self.s, routing=self.routing(sink)),
            (after[0], after[1], list(tables), *sink_params(sink))).fetchone()
        return max(0.0, float(row[0])) if row and row[0] is not None else None
