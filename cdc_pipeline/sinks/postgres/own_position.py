"""The Postgres sink's own record of how far it has applied the log, committed in the same transaction as the
rows (table `cdc_pipeline_sink.offsets` in the destination): a crash between that commit and the state
database's never applies a batch twice. One row per key: the sink's name, or a lane's (core/lanes.py)."""

from __future__ import annotations

from typing import Protocol

import psycopg
from psycopg import sql

from cdc_pipeline.core.positions import Position
from cdc_pipeline.sinks.base import SinkContext
from cdc_pipeline.sinks.postgres import OFFSETS_SCHEMA


class Sink(Protocol):
    """What of the Postgres sink its own position uses (the sink itself: client.py, which builds this)."""

    conn: psycopg.Connection | None
    context: SinkContext


_TABLE = sql.SQL("{}.offsets").format(sql.Identifier(OFFSETS_SCHEMA))


class OwnPosition:
    """The sink's `own_position` capability (sinks/base.py): read on the sink's connection, recorded under its
    context's `position_key`, never at or past its `ceiling`."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    @staticmethod
    def create(conn: psycopg.Connection) -> None:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(OFFSETS_SCHEMA)))
        conn.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (sink text PRIMARY KEY, commit_lsn bigint NOT NULL, "
            "commit_idx integer NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())").format(_TABLE))

    def read(self, key: str) -> Position | None:
        conn = self.sink.conn
        assert conn is not None, "read once the sink is open"
        row = conn.execute(sql.SQL("SELECT commit_lsn, commit_idx FROM {} WHERE sink = %s").format(_TABLE),
                           (key,)).fetchone()
        conn.commit()
        return (int(row[0]), int(row[1])) if row else None

    def record(self, conn: psycopg.Connection, last: Position) -> None:
        """In the batch's transaction. The engine parks a message at the ceiling only in its own later commit:
        a crash before it must resume at that message (replaying sent ones after it is harmless; skipping it
        is not)."""
        context = self.sink.context
        if context.ceiling is not None:
            last = min(last, (context.ceiling[0], context.ceiling[1] - 1))
        conn.execute(sql.SQL(
            "INSERT INTO {} AS o (sink, commit_lsn, commit_idx) VALUES (%s, %s, %s) "
            "ON CONFLICT (sink) DO UPDATE SET commit_lsn = excluded.commit_lsn, commit_idx = excluded.commit_idx, "
            "updated_at = now() WHERE (o.commit_lsn, o.commit_idx) < (excluded.commit_lsn, excluded.commit_idx)"
        ).format(_TABLE), (context.position_key, *last))
