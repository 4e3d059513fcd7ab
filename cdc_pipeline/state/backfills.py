"""Backfill records in the state database: creation (one active backfill per table and sink), control
(pause, resume, cancel), checkpoints and progress.

A backfill row holds what was asked (table, sinks, window) and the checkpoint the drain writes when it
reconciles a page (cursor, pages, rows read and dropped). A live runner holds a session advisory lock
on its backfill, so "active but nobody is running it" (a killed process) is told apart from "running".
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from cdc_pipeline.config.errors import redact
from cdc_pipeline.core.backfill_origin import dagster_links
from cdc_pipeline.postgres import session
from cdc_pipeline.state.base import SchemaStore
from cdc_pipeline.state.windows import disjoint

ACTIVE = ("running", "paused")
FINISHED = ("completed", "cancelled")


class BackfillError(RuntimeError):
    """A backfill cannot start or continue; the message says why and what to do."""


class BackfillConflict(BackfillError):
    """Another backfill is active for the same table and sink."""

    def __init__(self, message: str, alive: bool) -> None:
        super().__init__(message)
        self.alive = alive  # whether a process is running the conflicting backfill


@dataclass(frozen=True)
class BackfillSpec:
    """What a backfill reads and where it goes. Two requests with the same spec are the same backfill
    while it is active: the second resumes the first from its checkpoint."""

    table: str  # schema.table
    sinks: tuple[str, ...]
    sort_column: str | None = None
    start: str | None = None
    end: str | None = None

    @property
    def schema_name(self) -> str:
        return self.table.split(".", 1)[0]

    @property
    def table_name(self) -> str:
        return self.table.split(".", 1)[1]

    @property
    def identity(self) -> str:
        body = json.dumps([self.table, sorted(self.sinks), self.sort_column, self.start, self.end])
        return hashlib.sha1(body.encode()).hexdigest()

    def describe(self) -> str:
        if self.sort_column is None:
            return f"full backfill of {self.table}"
        window = f"{self.sort_column} >= {self.start!r}" if self.start is not None else f"all {self.sort_column}"
        if self.end is not None:
            window += f" and < {self.end!r}"
        return f"partial backfill of {self.table} ({window})"


@dataclass
class BackfillInfo:
    """One backfill's row, plus whether a runner holds it and its read-side counters."""

    id: str
    table: str
    sinks: list[str]
    status: str
    keyset: list[str]
    primary_key: list[str]
    sort_column: str | None
    start: str | None
    end: str | None
    origin: str | None
    estimated_rows: int | None
    cursor: list[str] | None
    pages: int
    rows_read: int
    rows_dropped: int
    checkpoint_at: datetime | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    error: str | None
    alive: bool = False
    pages_staged: int = 0
    rows_staged: int = 0
    page_attempts: int = 0
    page_size: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_emitted(self) -> int:
        return self.rows_read - self.rows_dropped

    @property
    def percent(self) -> float | None:
        if self.status == "completed":
            return 100.0
        if not self.estimated_rows:
            return None
        return round(min(99.9, 100.0 * self.rows_read / self.estimated_rows), 1)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "table": self.table, "sinks": self.sinks, "status": self.status,
            "process_alive": self.alive, "sort_column": self.sort_column, "start": self.start, "end": self.end,
            "origin": self.origin, **dagster_links(self.origin), "pages": self.pages, "rows_read": self.rows_read,
            "rows_dropped": self.rows_dropped, "rows_emitted": self.rows_emitted,
            "pages_in_flight": self.pages_staged, "page_attempts": self.page_attempts,
            "page_size": self.page_size, "estimated_rows": self.estimated_rows, "percent": self.percent,
            "cursor": self.cursor,
            "checkpoint_at": self.checkpoint_at.isoformat() if self.checkpoint_at else None,
            "created_at": self.created_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "error": self.error,
        }


def runner_lock_key(backfill_id: str) -> str:
    return f"cdc_pipeline.backfill:{backfill_id}"


def lock_held_sql(key: sql.Composable) -> sql.Composed:
    """SQL true while some session holds ``pg_advisory_lock(hashtext(key))`` in this database."""
    return session.lock_held_sql(sql.SQL("hashtext({})::bigint").format(key))


class BackfillStore(SchemaStore):
    # -- creation ---------------------------------------------------------------------------------
    def claim(self, conn: psycopg.Connection, spec: BackfillSpec, primary_key: Sequence[str],
              keyset: Sequence[str], origin: str, estimated_rows: int | None,
              max_parallel: int = 1) -> tuple[str, bool]:
        """Create the backfill, or take over the active one with the same spec whose runner is gone.

        Returns (id, resumed). On success this session holds the backfill's runner lock until it
        closes (or calls :meth:`release`). Raises BackfillConflict when an active backfill of another
        spec shares a sink, or the same one is being run by a live process. Windows of one sort column
        that do not overlap (Dagster partitions) may run side by side, up to ``max_parallel`` per table
        and sink: each reads its own rows, and reconciliation keeps every read at its own high
        watermark, so no read goes back behind a change. ``conn`` must be in autocommit mode.
        """
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"cdc_pipeline.backfill.table:{spec.table}",))
            rows = conn.execute(sql.SQL(
                "SELECT id, identity, sinks, status, pages, rows_read, estimated_rows, sort_column, start_value, "
                "end_value, {alive} FROM {s}.backfills WHERE table_schema = %s AND table_name = %s "
                "AND status IN ('running', 'paused') AND sinks && %s ORDER BY created_at"
            ).format(s=self.s, alive=lock_held_sql(sql.SQL("'cdc_pipeline.backfill:' || id"))),
                (spec.schema_name, spec.table_name, list(spec.sinks))).fetchall()
            side_by_side = [r for r in rows if r[1] != spec.identity
                            and disjoint(spec, BackfillSpec(spec.table, tuple(r[2]), r[7], r[8], r[9]))]
            if len(side_by_side) == len(rows) and len(rows) < max_parallel:
                rows = []  # every active one is another window: this one runs beside them
            for bid, identity, sinks, status, pages, rows_read, estimate, sort, start, end, alive in rows:
                if identity == spec.identity and not alive:
                    got = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (runner_lock_key(bid),)).fetchone()
                    if got and got[0]:
                        if status == "paused":
                            conn.execute(sql.SQL("UPDATE {}.backfills SET status = 'running', updated_at = now() "
                                                 "WHERE id = %s").format(self.s), (bid,))
                        return bid, True
                    alive = True  # took it between the check and the lock
                shared = sorted(set(sinks) & set(spec.sinks))
                other = BackfillSpec(spec.table, tuple(sinks), sort, start, end)
                progress = f"{pages} pages, {rows_read} rows read"
                if estimate:
                    progress += f" of ~{estimate}"
                if alive:
                    hint = (f"a process is running it; wait for it to finish, or `cdc-pipeline backfill pause {bid}` "
                            f"/ `cdc-pipeline backfill cancel {bid}`")
                else:
                    hint = (f"no process is running it (interrupted); continue it with `cdc-pipeline backfill resume "
                            f"{bid}` or drop it with `cdc-pipeline backfill cancel {bid}`")
                raise BackfillConflict(
                    f"backfill {bid} ({other.describe()}, {status}, {progress}) is already active for "
                    f"{spec.table} -> sink {', '.join(shared)}: one backfill per table and sink at a time (or up to "
                    f"backfill.max_parallel={max_parallel} windows that do not overlap); {hint}",
                    alive=alive)
            bid = f"bf_{uuid.uuid4().hex[:12]}"
            conn.execute(sql.SQL(
                "INSERT INTO {}.backfills (id, identity, table_schema, table_name, sinks, primary_key, keyset, "
                "sort_column, start_value, end_value, origin, estimated_rows) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)").format(self.s),
                (bid, spec.identity, spec.schema_name, spec.table_name, list(spec.sinks), list(primary_key),
                 list(keyset), spec.sort_column, spec.start, spec.end, origin, estimated_rows))
            conn.execute(sql.SQL("INSERT INTO {}.backfill_readers (backfill_id) VALUES (%s)").format(self.s), (bid,))
            conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (runner_lock_key(bid),))
            return bid, False

    def lock(self, conn: psycopg.Connection, backfill_id: str) -> bool:
        """Take the runner lock of an existing backfill (for `resume`); False if a process holds it."""
        row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (runner_lock_key(backfill_id),)).fetchone()
        return bool(row and row[0])

    def release(self, conn: psycopg.Connection, backfill_id: str) -> None:
        conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (runner_lock_key(backfill_id),))

    # -- control ----------------------------------------------------------------------------------
    def set_status(self, conn: psycopg.Connection, backfill_id: str, status: str) -> str:
        """pause / resume / cancel. Returns the previous status; raises BackfillError when the
        transition makes no sense (unknown id, already finished)."""
        with conn.transaction():
            row = conn.execute(sql.SQL("SELECT status FROM {}.backfills WHERE id = %s FOR UPDATE").format(self.s),
                               (backfill_id,)).fetchone()
            if row is None:
                raise BackfillError(f"no backfill {backfill_id!r} (see `cdc-pipeline backfill list`)")
            current = str(row[0])
            if current in FINISHED:
                raise BackfillError(f"backfill {backfill_id} is already {current}")
            conn.execute(sql.SQL(
                "UPDATE {}.backfills SET status = %s, updated_at = now(), "
                "finished_at = CASE WHEN %s = 'cancelled' THEN now() END WHERE id = %s").format(self.s),
                (status, status, backfill_id))
            if status == "cancelled":
                self._drop_staged(conn, backfill_id)
            return current

    def _drop_staged(self, conn: psycopg.Connection, backfill_id: str) -> None:
        # Pages not yet reconciled will never be: the drain skips cancelled backfills.
        conn.execute(sql.SQL("UPDATE {}.backfill_pages SET status = 'cancelled' WHERE backfill_id = %s "
                             "AND status = 'staged'").format(self.s), (backfill_id,))
        self.cleanup(conn, backfill_id)

    def cleanup(self, conn: psycopg.Connection, backfill_id: str) -> None:
        """Forget the staged rows and low watermarks of a finished backfill (pages stay as history)."""
        conn.execute(sql.SQL("DELETE FROM {}.backfill_rows WHERE backfill_id = %s").format(self.s), (backfill_id,))
        conn.execute(sql.SQL("DELETE FROM {}.backfill_low_watermarks WHERE backfill_id = %s").format(self.s),
                     (backfill_id,))

    def record_error(self, conn: psycopg.Connection, backfill_id: str, error: str | None) -> None:
        conn.execute(sql.SQL("UPDATE {}.backfills SET error = %s, updated_at = now() WHERE id = %s").format(self.s),
                     (redact(error) if error else error, backfill_id))  # shown by status and Dagster

    # -- reading ----------------------------------------------------------------------------------
    def mac_key(self, conn: psycopg.Connection, backfill_id: str) -> str:
        """The key that signs this backfill's watermarks (never shown: not in BackfillInfo or metadata)."""
        return self._field(conn, backfill_id, "mac_key")

    def status(self, conn: psycopg.Connection, backfill_id: str) -> str:
        return self._field(conn, backfill_id, "status")

    def _field(self, conn: psycopg.Connection, backfill_id: str, column: str) -> str:
        row = conn.execute(sql.SQL("SELECT {} FROM {}.backfills WHERE id = %s").format(
            sql.Identifier(column), self.s), (backfill_id,)).fetchone()
        if row is None:
            raise BackfillError(f"backfill {backfill_id} vanished from the state database")
        return str(row[0])

    def get(self, conn: psycopg.Connection, backfill_id: str) -> BackfillInfo:
        found = self._select(conn, sql.SQL("b.id = %s"), (backfill_id,))
        if not found:
            raise BackfillError(f"no backfill {backfill_id!r} (see `cdc-pipeline backfill list`)")
        return found[0]

    def list(self, conn: psycopg.Connection, active_only: bool = False, limit: int = 50) -> list[BackfillInfo]:
        where = sql.SQL("b.status IN ('running', 'paused')") if active_only else sql.SQL("true")
        return self._select(conn, where, (), limit)

    def _select(self, conn: psycopg.Connection, where: sql.Composable, params: tuple[object, ...],
                limit: int = 50) -> list[BackfillInfo]:
        query = sql.SQL(
            "SELECT b.*, {alive} AS alive, coalesce(r.page_attempts, 0) AS page_attempts, r.page_size, "
            "(SELECT count(*) FROM {s}.backfill_pages p WHERE p.backfill_id = b.id AND p.status = 'staged') "
            "AS pages_staged, "
            "(SELECT coalesce(sum(p.rows), 0) FROM {s}.backfill_pages p WHERE p.backfill_id = b.id) AS rows_staged "
            "FROM {s}.backfills b LEFT JOIN {s}.backfill_readers r ON r.backfill_id = b.id "
            "WHERE {where} ORDER BY b.created_at DESC LIMIT %s"
        ).format(s=self.s, where=where, alive=lock_held_sql(sql.SQL("'cdc_pipeline.backfill:' || b.id")))
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(query, (*params, limit)).fetchall()
        return [BackfillInfo(
            id=r["id"], table=f"{r['table_schema']}.{r['table_name']}", sinks=list(r["sinks"]), status=r["status"],
            keyset=list(r["keyset"]), primary_key=list(r["primary_key"]), sort_column=r["sort_column"],
            start=r["start_value"], end=r["end_value"], origin=r["origin"], estimated_rows=r["estimated_rows"],
            cursor=list(r["cursor"]) if r["cursor"] is not None else None, pages=int(r["pages"]),
            rows_read=int(r["rows_read"]), rows_dropped=int(r["rows_dropped"]), checkpoint_at=r["checkpoint_at"],
            created_at=r["created_at"], updated_at=r["updated_at"], finished_at=r["finished_at"], error=r["error"],
            alive=bool(r["alive"]), pages_staged=int(r["pages_staged"]), rows_staged=int(r["rows_staged"]),
            page_attempts=int(r["page_attempts"]), page_size=r["page_size"],
        ) for r in rows]

    def pages(self, conn: psycopg.Connection, backfill_id: str) -> list[dict[str, Any]]:
        with conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(sql.SQL(
                "SELECT page_no, page_size, rows, read_ms, cursor, last, status, dropped, high_lsn, high_idx, "
                "snapshot, read_at "
                "FROM {}.backfill_pages WHERE backfill_id = %s ORDER BY page_no").format(self.s),
                (backfill_id,)).fetchall()

    def orphans(self, conn: psycopg.Connection, origin_like: str) -> list[tuple[str, str]]:
        """(id, schema.table) of active backfills whose origin matches and that no process is running."""
        alive = lock_held_sql(sql.SQL("'cdc_pipeline.backfill:' || id"))
        rows = conn.execute(sql.SQL(
            "SELECT id, table_schema || '.' || table_name FROM {}.backfills WHERE status IN ('running', 'paused') "
            "AND origin LIKE %s AND NOT {} ORDER BY created_at").format(self.s, alive), (origin_like,)).fetchall()
        return [(str(r[0]), str(r[1])) for r in rows]

    def drain_running(self, conn: psycopg.Connection, slot: str) -> bool:
        row = conn.execute(sql.SQL("SELECT {}").format(session.lock_holder_sql()),
                           (f"cdc_pipeline.drain:{slot}",)).fetchone()
        return bool(row and row[0])
