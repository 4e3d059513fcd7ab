"""The state tables delivery works with, behind one object: the change log, the sinks' offsets, the failed
messages and the recorded relations. Each concern lives in its own module; `Store` hands calls on to them,
so a deliverer (and whatever it passes its store to) holds one object."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from functools import cached_property

import psycopg
import pyarrow as pa

from cdc_pipeline.postgres.catalog import TableInfo
from cdc_pipeline.state import relations, retention, slot_progress
from cdc_pipeline.state.base import Position, SchemaStore
from cdc_pipeline.state.change_log import (
    LOG_ARROW_SCHEMA,
    LOG_ARROW_SCHEMA_TYPED,
    ChangeLog,
    LaneBlock,
    LaneShare,
)
from cdc_pipeline.state.failed_messages import FailedMessages
from cdc_pipeline.state.sink_offsets import SinkOffsets
from cdc_pipeline.state.typed_log import TypedRun

__all__ = ["LOG_ARROW_SCHEMA", "LOG_ARROW_SCHEMA_TYPED", "Position", "Store"]


class Store(SchemaStore):
    @cached_property
    def log(self) -> ChangeLog:
        return ChangeLog(self.schema)

    @cached_property
    def offsets(self) -> SinkOffsets:
        return SinkOffsets(self.schema)

    @cached_property
    def failed(self) -> FailedMessages:
        return FailedMessages(self.schema)

    # -- the log (state/change_log.py) ------------------------------------------------------------
    def load_batch(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, limit: int,
                   sink: str | None = None, max_bytes: int | None = None, typed: bool = False) -> pa.Table:
        return self.log.load_batch(conn, tables, after, limit, sink, max_bytes, typed)

    def load_lane_block(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, limit: int,
                        share: LaneShare, sink: str | None = None, max_bytes: int | None = None,
                        typed: bool = False) -> LaneBlock:
        return self.log.load_lane_block(conn, tables, after, limit, share, sink, max_bytes, typed)

    def head_run(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, limit: int,
                 sink: str) -> TypedRun | None:
        return self.log.head_run(conn, tables, after, limit, sink)

    def relay_rows(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, run: TypedRun,
                   sink: str) -> AbstractContextManager[Iterator[bytes]]:
        return self.log.relay_rows(conn, tables, after, run, sink)

    def load_positions(self, conn: psycopg.Connection, positions: Sequence[Position]) -> pa.Table:
        return self.log.load_positions(conn, positions)

    def log_head(self, conn: psycopg.Connection, tables: Sequence[str], sink: str | None = None) -> Position:
        return self.log.log_head(conn, tables, sink)

    def count_after(self, conn: psycopg.Connection, tables: Sequence[str], after: Position,
                    sink: str | None = None, upto: Position | None = None) -> int:
        return self.log.count_after(conn, tables, after, sink, upto)

    def backlog(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, sink: str, limit: int) -> int:
        return self.log.backlog(conn, tables, after, sink, limit)

    def oldest_age(self, conn: psycopg.Connection, tables: Sequence[str], after: Position,
                   sink: str | None = None) -> float | None:
        return self.log.oldest_age(conn, tables, after, sink)

    def apply_retention(self, conn: psycopg.Connection, hours: float, sinks: Sequence[str]) -> int:
        return retention.trim_log(conn, self.schema, hours, sinks)

    def slot_progress(self, conn: psycopg.Connection, slot: str) -> tuple[int, float | None]:
        return slot_progress.heartbeat(conn, self.schema, slot)

    # -- relations (state/relations.py) -----------------------------------------------------------
    def relation_columns(self, conn: psycopg.Connection) -> dict[str, list[dict[str, object]]]:
        return relations.relation_columns(conn, self.schema)

    def table_info(self, conn: psycopg.Connection, table: str) -> TableInfo | None:
        return relations.table_info(conn, self.schema, table)

    # -- sink offsets (state/sink_offsets.py) -----------------------------------------------------
    def sink_offset(self, conn: psycopg.Connection, sink: str, lane: int = 0) -> Position:
        return self.offsets.sink_offset(conn, sink, lane)

    def delivered_total(self, conn: psycopg.Connection, sink: str) -> int:
        return self.offsets.delivered_total(conn, sink)

    def advance_offset(self, conn: psycopg.Connection, sink: str, position: Position, delivered: int,
                       filtered: int, parked: int, last_commit_ts: datetime | None, lane: int = 0,
                       read: int = 0) -> None:
        self.offsets.advance_offset(conn, sink, position, delivered, filtered, parked, last_commit_ts, lane, read)

    def set_waiting(self, conn: psycopg.Connection, sink: str, reason: str | None, lane: int = 0) -> None:
        self.offsets.set_waiting(conn, sink, reason, lane)

    # -- failed messages (state/failed_messages.py) -----------------------------------------------
    def parked_groups(self, conn: psycopg.Connection, sink: str, lane: int = 0) -> set[str | None]:
        return self.failed.parked_groups(conn, sink, lane)

    def park(self, conn: psycopg.Connection, sink: str, items: Sequence[tuple[Position, str | None, str, int]],
             delay_ms: Sequence[int], lane: int = 0) -> None:
        self.failed.park(conn, sink, items, delay_ms, lane)

    def due_retries(self, conn: psycopg.Connection, sink: str, limit: int,
                    lane: int = 0) -> list[tuple[Position, str | None, int]]:
        return self.failed.due_retries(conn, sink, limit, lane)

    def resolve(self, conn: psycopg.Connection, sink: str, positions: Sequence[Position]) -> None:
        self.failed.resolve(conn, sink, positions)

    def discard(self, conn: psycopg.Connection, sink: str, position: Position, error: str) -> None:
        self.failed.discard(conn, sink, position, error)

    def failed_summary(self, conn: psycopg.Connection, sink: str) -> dict[str, float | int | None]:
        return self.failed.failed_summary(conn, sink)
