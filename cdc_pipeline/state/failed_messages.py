"""The `failed_messages` table: messages a sink rejected, parked for retries (or discarded), by group."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from cdc_pipeline.config.errors import redact
from cdc_pipeline.state.base import Position, SchemaStore


class FailedMessages(SchemaStore):
    """Parked messages belong to the lane of their group (core/lanes.py; lane 0 without lanes); the
    operator's views and verbs (list, retry, discard) work on the whole sink."""

    def parked_groups(self, conn: psycopg.Connection, sink: str, lane: int = 0) -> set[str | None]:
        rows = conn.execute(sql.SQL(
            "SELECT DISTINCT group_key FROM {}.failed_messages WHERE sink = %s AND lane = %s AND status = 'parked'")
            .format(self.s), (sink, lane)).fetchall()
        return {r[0] for r in rows}

    def park(self, conn: psycopg.Connection, sink: str, items: Sequence[tuple[Position, str | None, str, int]],
             delay_ms: Sequence[int], lane: int = 0) -> None:
        """items: (position, group, error, attempts); a held message has attempts 0."""
        if not items:
            return
        conn.cursor().executemany(sql.SQL(
            "INSERT INTO {}.failed_messages (sink, lane, commit_lsn, commit_idx, group_key, attempts, last_error, "
            "next_attempt_at) VALUES (%s, %s, %s, %s, %s, %s, %s, now() + make_interval(secs => %s / 1000.0)) "
            "ON CONFLICT (sink, commit_lsn, commit_idx) DO UPDATE SET attempts = excluded.attempts, "
            "last_error = excluded.last_error, next_attempt_at = excluded.next_attempt_at, status = 'parked'")
            .format(self.s),
            [(sink, lane, p[0], p[1], g, a, redact(e), d) for (p, g, e, a), d in zip(items, delay_ms, strict=True)])

    def due_retries(self, conn: psycopg.Connection, sink: str, limit: int,
                    lane: int = 0) -> list[tuple[Position, str | None, int]]:
        """Parked messages of groups whose head is due, in log order: (position, group, attempts)."""
        rows = conn.execute(sql.SQL(
            "WITH heads AS (SELECT DISTINCT ON (group_key) group_key, next_attempt_at FROM {s}.failed_messages "
            "  WHERE sink = %s AND lane = %s AND status = 'parked' ORDER BY group_key, commit_lsn, commit_idx) "
            "SELECT f.commit_lsn, f.commit_idx, f.group_key, f.attempts FROM {s}.failed_messages f "
            "JOIN heads h ON h.group_key IS NOT DISTINCT FROM f.group_key "
            "WHERE f.sink = %s AND f.lane = %s AND f.status = 'parked' AND h.next_attempt_at <= now() "
            "ORDER BY f.commit_lsn, f.commit_idx LIMIT %s").format(s=self.s),
            (sink, lane, sink, lane, limit)).fetchall()
        return [((int(r[0]), int(r[1])), r[2], int(r[3])) for r in rows]

    def resolve(self, conn: psycopg.Connection, sink: str, positions: Sequence[Position]) -> None:
        if positions:
            conn.execute(sql.SQL(
                "DELETE FROM {}.failed_messages WHERE sink = %s AND (commit_lsn, commit_idx) IN "
                "(SELECT * FROM unnest(%s::bigint[], %s::int[]))").format(self.s),
                (sink, [p[0] for p in positions], [p[1] for p in positions]))

    def discard(self, conn: psycopg.Connection, sink: str, position: Position, error: str) -> None:
        """Give up on a parked message; the sink's offsets row counts it."""
        conn.execute(sql.SQL(
            "UPDATE {}.failed_messages SET status = 'discarded', last_error = %s WHERE sink = %s "
            "AND commit_lsn = %s AND commit_idx = %s").format(self.s), (redact(error), sink, position[0], position[1]))
        # Counted on lane 0's row, which every split has: status sums the lanes.
        conn.execute(sql.SQL("UPDATE {}.sink_offsets SET discarded = discarded + 1 WHERE sink = %s AND lane = 0")
                     .format(self.s), (sink,))

    def failed_summary(self, conn: psycopg.Connection, sink: str) -> dict[str, float | int | None]:
        row = conn.execute(sql.SQL(
            "SELECT count(*) FILTER (WHERE status = 'parked'), count(*) FILTER (WHERE status = 'discarded'), "
            "extract(epoch FROM now() - min(first_failed_at) FILTER (WHERE status = 'parked'))::float8 "
            "FROM {}.failed_messages WHERE sink = %s").format(self.s), (sink,)).fetchone()
        assert row is not None
        return {"parked": int(row[0]), "discarded": int(row[1]),
                "oldest_parked_seconds": round(row[2], 1) if row[2] is not None else None}

    def list_failed(self, conn: psycopg.Connection, sink: str | None) -> list[dict[str, object]]:
        rows = conn.execute(sql.SQL(
            "SELECT sink, commit_lsn, commit_idx, group_key, status, attempts, last_error, first_failed_at, "
            "next_attempt_at FROM {}.failed_messages WHERE %s::text IS NULL OR sink = %s "
            "ORDER BY sink, commit_lsn, commit_idx").format(self.s), (sink, sink)).fetchall()
        keys = ("sink", "commit_lsn", "commit_idx", "group_key", "status", "attempts", "last_error",
                "first_failed_at", "next_attempt_at")
        # Masked again on the way out: an error stored by an older version may still hold a secret.
        return [{**dict(zip(keys, r, strict=True)), "last_error": redact(r[6]) if r[6] else r[6], "id": f"{r[1]}:{r[2]}"}
                for r in rows]

    def parked_details(self, conn: psycopg.Connection, sink: str, limit: int) -> list[dict[str, object]]:
        """The sink's parked messages, oldest first, with their table and key from the change log (a message
        the retention already dropped from the log has neither)."""
        rows = conn.execute(sql.SQL(
            "SELECT f.commit_lsn, f.commit_idx, l.table_schema || '.' || l.table_name, l.pk, f.group_key, "
            "f.attempts, f.last_error, extract(epoch FROM now() - f.first_failed_at)::float8 "
            "FROM {s}.failed_messages f LEFT JOIN {s}.change_log l "
            "ON (l.commit_lsn, l.commit_idx) = (f.commit_lsn, f.commit_idx) "
            "WHERE f.sink = %s AND f.status = 'parked' ORDER BY f.commit_lsn, f.commit_idx LIMIT %s")
            .format(s=self.s), (sink, limit)).fetchall()
        keys = ("commit_lsn", "commit_idx", "table", "key", "group_key", "attempts", "last_error", "age_seconds")
        return [{**dict(zip(keys, r, strict=True)), "last_error": redact(r[6]) if r[6] else "",
                 "id": f"{r[0]}:{r[1]}"} for r in rows]

    def positions_of_table(self, conn: psycopg.Connection, sink: str, table: str,
                           include_discarded: bool = False) -> list[Position]:
        """Failed messages of one source table (schema.table), parked (and discarded ones too if asked)."""
        schema, _, name = table.partition(".")
        rows = conn.execute(sql.SQL(
            "SELECT f.commit_lsn, f.commit_idx FROM {s}.failed_messages f JOIN {s}.change_log l "
            "ON (l.commit_lsn, l.commit_idx) = (f.commit_lsn, f.commit_idx) "
            "WHERE f.sink = %s AND l.table_schema = %s AND l.table_name = %s AND (f.status = 'parked' OR %s) "
            "ORDER BY 1, 2").format(s=self.s), (sink, schema, name, include_discarded)).fetchall()
        return [(int(r[0]), int(r[1])) for r in rows]

    def retry_now(self, conn: psycopg.Connection, sink: str | None, position: Position | None,
                  include_discarded: bool = False) -> tuple[int, int]:
        """Make parked messages due now (None position = all of the sink(s)); discarded ones too with
        ``include_discarded``. Returns (made due, of which were discarded)."""
        rows = conn.execute(sql.SQL(
            "UPDATE {s}.failed_messages f SET status = 'parked', next_attempt_at = now() "
            "FROM (SELECT sink, commit_lsn, commit_idx, status FROM {s}.failed_messages "
            "      WHERE (%s::text IS NULL OR sink = %s) "
            "      AND (%s::bigint IS NULL OR (commit_lsn = %s AND commit_idx = %s)) "
            "      AND (status = 'parked' OR %s) FOR UPDATE) old "
            "WHERE (f.sink, f.commit_lsn, f.commit_idx) = (old.sink, old.commit_lsn, old.commit_idx) "
            "RETURNING old.status").format(s=self.s),
            (sink, sink, *_pos_params(position), include_discarded)).fetchall()
        return len(rows), sum(1 for r in rows if r[0] == "discarded")

    def discard_now(self, conn: psycopg.Connection, sink: str | None, position: Position | None) -> int:
        cur = conn.execute(sql.SQL(
            "UPDATE {}.failed_messages SET status = 'discarded', last_error = coalesce(last_error, '') || "
            "' (discarded by operator)' WHERE status = 'parked' AND (%s::text IS NULL OR sink = %s) "
            "AND (%s::bigint IS NULL OR (commit_lsn = %s AND commit_idx = %s))").format(self.s),
            (sink, sink, *_pos_params(position)))
        return cur.rowcount


def _pos_params(position: Position | None) -> tuple[int | None, int | None, int | None]:
    return (None, None, None) if position is None else (position[0], position[0], position[1])
