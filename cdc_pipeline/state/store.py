"""Reads and writes of the state database: log batches, relations, sink offsets, failed messages."""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql

from cdc_pipeline.config.errors import redact
from cdc_pipeline.postgres.catalog import ColumnInfo, TableInfo
from cdc_pipeline.state import typed_log, typed_rows
from cdc_pipeline.state.base import Position, SchemaStore

LOG_ARROW_SCHEMA = pa.schema([
    ("commit_lsn", pa.int64()), ("commit_idx", pa.int32()), ("xid", pa.int64()),
    ("table_schema", pa.string()), ("table_name", pa.string()), ("action", pa.string()),
    ("pk", pa.string()), ("record", pa.string()), ("changes", pa.string()),
    ("commit_ts", pa.timestamp("us", tz="UTC")), ("backfill_id", pa.string()),
    ("texts", pa.string()),  # values' texts for a mirror (postgres/pgtypeinfo.py: TextRule), mostly null
    ("annotations", pa.string()),  # the transaction's annotation (capture/annotations.py), mostly null
])
# With the typed row of a read (state/typed_rows.py) for sinks that take it as it is.
LOG_ARROW_SCHEMA_TYPED = LOG_ARROW_SCHEMA.append(pa.field("tup", pa.string()))
# commit_ts travels as microseconds since the epoch: a plain integer for the CSV reader. A typed read's
# record is made from its typed row here, for every consumer that did not ask for typed rows.
_COLUMNS = ("SELECT commit_lsn, commit_idx, xid, table_schema, table_name, action, pk, {record}, "
            "changes::text, (extract(epoch FROM commit_ts) * 1000000)::bigint, backfill_id, texts::text, "
            "annotations::text{tup} "
            "FROM {{0}}.change_log ")
_SELECT = _COLUMNS.format(
    record="CASE WHEN tup IS NULL THEN record::text ELSE {0}.typed_record(backfill_id, tup)::text END", tup="")
_SELECT_TYPED = _COLUMNS.format(record="record::text", tup=", tup")


def _copy_arrow(conn: psycopg.Connection, query: sql.Composable, params: Sequence[object],
                schema: pa.Schema = LOG_ARROW_SCHEMA) -> pa.Table:
    """Run a log SELECT as COPY ... CSV and parse it with Arrow's C++ reader: several times faster
    than building Python tuples, and the batch is wanted as Arrow anyway."""
    buf = io.BytesIO()
    with conn.cursor() as cur, cur.copy(sql.SQL("COPY ({}) TO STDOUT WITH (FORMAT csv)").format(query),
                                        params) as copy:
        for chunk in copy:
            buf.write(chunk)
    if buf.tell() == 0:
        return schema.empty_table()
    buf.seek(0)
    table = pacsv.read_csv(
        buf,
        read_options=pacsv.ReadOptions(column_names=schema.names, block_size=1 << 24),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        # PostgreSQL's CSV: an unquoted empty field is NULL, a quoted one ("") the empty string.
        convert_options=pacsv.ConvertOptions(
            column_types={f.name: (pa.int64() if f.name == "commit_ts" else f.type) for f in schema},
            null_values=[""], strings_can_be_null=True, quoted_strings_can_be_null=False),
    )
    ts = table.column("commit_ts").cast(pa.timestamp("us", tz="UTC"))
    return table.set_column(table.schema.get_field_index("commit_ts"), "commit_ts", ts)


def _sink(sink: str | None) -> tuple[str, ...]:
    return () if sink is None else (sink,)


class Store(SchemaStore):
    # -- the log ----------------------------------------------------------------------------------
    def load_batch(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, limit: int,
                   sink: str | None = None, max_bytes: int | None = None, typed: bool = False) -> pa.Table:
        """Up to ``limit`` messages after ``after``; with ``max_bytes``, also stop once the messages so far
        hold that many bytes of record and changes JSON (always at least one message). ``typed``: typed
        reads keep their typed row (column ``tup``, record null) instead of being turned into JSON."""
        where = sql.SQL("WHERE (commit_lsn, commit_idx) > (%s, %s) AND table_schema || '.' || table_name = ANY(%s) "
                        "{routing}ORDER BY commit_lsn, commit_idx LIMIT %s").format(routing=self._routing(sink))
        params: tuple[object, ...] = (after[0], after[1], list(tables), *_sink(sink), limit)
        # Typed reads are loaded as they are; for JSON they are turned into records here (typed_rows.py).
        select = _SELECT_TYPED
        if max_bytes is None:
            query: sql.Composable = sql.SQL(select).format(self.s) + where
        else:
            # The running total of sizes decides (a truncate has no record: size 0, never NULL, or the
            # comparison would drop it), then the text.
            size = ("coalesce(octet_length(l.record::text), octet_length(l.tup), 0) "
                    "+ coalesce(octet_length(l.changes::text), 0)")
            query = sql.SQL(select.replace("{0}.change_log", "(")).format(self.s) + sql.SQL(
                f"SELECT l.*, sum({size}) OVER (ORDER BY l.commit_lsn, l.commit_idx ROWS UNBOUNDED PRECEDING) "
                f"AS _total, {size} AS _bytes FROM (SELECT * FROM {{}}.change_log ").format(self.s) + where + sql.SQL(
                ") l) b WHERE b._total - b._bytes < %s ORDER BY commit_lsn, commit_idx")
            params = (*params, max_bytes)
        typed_log.scan_in_log_order(conn)
        batch = _copy_arrow(conn, query, params, LOG_ARROW_SCHEMA_TYPED)
        return batch if typed else typed_rows.with_records(conn, self.schema, batch)

    def head_run(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, limit: int,
                 sink: str) -> typed_log.TypedRun | None:
        """The run of typed reads, or of other messages, at the head of a sink's log (state/typed_log.py)."""
        return typed_log.head_run(conn, self.schema, self._routing(sink), (list(tables), sink), after, limit)

    def relay_rows(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, run: typed_log.TypedRun,
                   sink: str) -> AbstractContextManager[Iterator[bytes]]:
        """A typed run's rows as COPY text blocks, for a sink that writes them as they are."""
        return typed_log.relay_rows(conn, self.schema, self._routing(sink), (list(tables), sink), after, run)

    def load_positions(self, conn: psycopg.Connection, positions: Sequence[Position]) -> pa.Table:
        query = sql.SQL(_SELECT + "WHERE (commit_lsn, commit_idx) IN (SELECT * FROM unnest(%s::bigint[], %s::int[])) "
                        "ORDER BY commit_lsn, commit_idx").format(self.s)
        return _copy_arrow(conn, query, ([p[0] for p in positions], [p[1] for p in positions]))

    def log_head(self, conn: psycopg.Connection, tables: Sequence[str], sink: str | None = None) -> Position:
        row = conn.execute(sql.SQL(
            "SELECT commit_lsn, commit_idx FROM {}.change_log WHERE table_schema || '.' || table_name = ANY(%s) "
            "{routing}ORDER BY commit_lsn DESC, commit_idx DESC LIMIT 1").format(self.s, routing=self._routing(sink)),
            (list(tables), *_sink(sink))).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, -1)

    def count_after(self, conn: psycopg.Connection, tables: Sequence[str], after: Position,
                    sink: str | None = None, upto: Position | None = None) -> int:
        """A sink's messages after ``after`` (and up to ``upto``, when given)."""
        last = upto or (2**63 - 1, 2**31 - 1)
        row = conn.execute(sql.SQL(
            "SELECT count(*) FROM {}.change_log WHERE (commit_lsn, commit_idx) > (%s, %s) "
            "AND (commit_lsn, commit_idx) <= (%s, %s) "
            "AND table_schema || '.' || table_name = ANY(%s) {routing}").format(self.s, routing=self._routing(sink)),
            (after[0], after[1], last[0], last[1], list(tables), *_sink(sink))).fetchone()
        return int(row[0]) if row else 0

    def backlog(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, sink: str, limit: int) -> int:
        """Like count_after, but stops counting at ``limit`` (cheap enough to ask often)."""
        row = conn.execute(sql.SQL(
            "SELECT count(*) FROM (SELECT 1 FROM {}.change_log WHERE (commit_lsn, commit_idx) > (%s, %s) "
            "AND table_schema || '.' || table_name = ANY(%s) {routing}LIMIT %s) t").format(
                self.s, routing=self._routing(sink)),
            (after[0], after[1], list(tables), *_sink(sink), limit)).fetchone()
        return int(row[0]) if row else 0

    def oldest_age(self, conn: psycopg.Connection, tables: Sequence[str], after: Position,
                   sink: str | None = None) -> float | None:
        """Seconds since the commit of the first message after ``after`` (a sink's lag), None if none."""
        row = conn.execute(sql.SQL(
            "SELECT extract(epoch FROM now() - commit_ts)::float8 FROM {}.change_log "
            "WHERE (commit_lsn, commit_idx) > (%s, %s) AND table_schema || '.' || table_name = ANY(%s) "
            "{routing}ORDER BY commit_lsn, commit_idx LIMIT 1").format(self.s, routing=self._routing(sink)),
            (after[0], after[1], list(tables), *_sink(sink))).fetchone()
        return max(0.0, float(row[0])) if row and row[0] is not None else None

    def slot_progress(self, conn: psycopg.Connection, slot: str) -> tuple[int, float | None]:
        """(committed LSN, seconds since the drain last committed to the log) for a slot."""
        row = conn.execute(sql.SQL(
            "SELECT committed_lsn, extract(epoch FROM now() - last_heartbeat_at)::float8 "
            "FROM {}.slot_progress WHERE slot = %s").format(self.s), (slot,)).fetchone()
        return (int(row[0]), row[1]) if row else (0, None)

    def _routing(self, sink: str | None) -> sql.Composable:
        """Backfill reads reach only the sinks their backfill targets; changes reach every sink."""
        if sink is None:
            return sql.SQL("")
        return sql.SQL("AND (backfill_id IS NULL OR backfill_id IN "
                       "(SELECT id FROM {}.backfills WHERE %s = ANY(sinks))) ").format(self.s)

    # -- relations --------------------------------------------------------------------------------
    def relation_columns(self, conn: psycopg.Connection) -> dict[str, list[dict[str, object]]]:
        rows = conn.execute(sql.SQL(
            "SELECT table_schema || '.' || table_name, columns FROM {}.relations").format(self.s)).fetchall()
        return {r[0]: r[1] for r in rows}

    def table_info(self, conn: psycopg.Connection, table: str) -> TableInfo | None:
        schema, _, name = table.partition(".")
        row = conn.execute(sql.SQL(
            "SELECT columns, primary_key, replica_identity FROM {}.relations "
            "WHERE table_schema = %s AND table_name = %s").format(self.s), (schema, name)).fetchone()
        if row is None:
            return None
        columns, pk, identity = row
        return TableInfo(schema, name, tuple(
            ColumnInfo(c["name"], c.get("type_sql") or "text", int(c["type_oid"]), False, c["name"] in pk,
                       c.get("mirror_type"))
            for c in columns), tuple(pk), identity or "d")

    # -- sink offsets -----------------------------------------------------------------------------
    def sink_offset(self, conn: psycopg.Connection, sink: str) -> Position:
        conn.execute(sql.SQL("INSERT INTO {}.sink_offsets (sink) VALUES (%s) ON CONFLICT DO NOTHING")
                     .format(self.s), (sink,))
        row = conn.execute(sql.SQL("SELECT commit_lsn, commit_idx FROM {}.sink_offsets WHERE sink = %s")
                           .format(self.s), (sink,)).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def delivered_total(self, conn: psycopg.Connection, sink: str) -> int:
        row = conn.execute(sql.SQL("SELECT delivered FROM {}.sink_offsets WHERE sink = %s").format(self.s),
                           (sink,)).fetchone()
        return int(row[0]) if row else 0

    def advance_offset(self, conn: psycopg.Connection, sink: str, position: Position, delivered: int,
                       filtered: int, parked: int, last_commit_ts: datetime | None) -> None:
        conn.execute(sql.SQL(
            "UPDATE {}.sink_offsets SET commit_lsn = %s, commit_idx = %s, delivered = delivered + %s, "
            "filtered = filtered + %s, parked = parked + %s, "
            "last_commit_ts = coalesce(%s, last_commit_ts), updated_at = now() "
            "WHERE sink = %s AND (commit_lsn, commit_idx) <= (%s, %s)").format(self.s),
            (position[0], position[1], delivered, filtered, parked, last_commit_ts, sink, position[0], position[1]))

    def set_waiting(self, conn: psycopg.Connection, sink: str, reason: str | None) -> None:
        """Record that the sink's delivery waits for its destination (reason None: it no longer does)."""
        conn.execute(sql.SQL(
            "UPDATE {}.sink_offsets SET waiting_reason = %s, waiting_since = CASE WHEN %s::text IS NULL THEN NULL "
            "ELSE coalesce(waiting_since, now()) END WHERE sink = %s").format(self.s), (reason, reason, sink))

    # -- failed messages --------------------------------------------------------------------------
    def parked_groups(self, conn: psycopg.Connection, sink: str) -> set[str | None]:
        rows = conn.execute(sql.SQL(
            "SELECT DISTINCT group_key FROM {}.failed_messages WHERE sink = %s AND status = 'parked'")
            .format(self.s), (sink,)).fetchall()
        return {r[0] for r in rows}

    def park(self, conn: psycopg.Connection, sink: str, items: Sequence[tuple[Position, str | None, str, int]],
             delay_ms: Sequence[int]) -> None:
        """items: (position, group, error, attempts); a held message has attempts 0."""
        if not items:
            return
        conn.cursor().executemany(sql.SQL(
            "INSERT INTO {}.failed_messages (sink, commit_lsn, commit_idx, group_key, attempts, last_error, "
            "next_attempt_at) VALUES (%s, %s, %s, %s, %s, %s, now() + make_interval(secs => %s / 1000.0)) "
            "ON CONFLICT (sink, commit_lsn, commit_idx) DO UPDATE SET attempts = excluded.attempts, "
            "last_error = excluded.last_error, next_attempt_at = excluded.next_attempt_at, status = 'parked'")
            .format(self.s),
            [(sink, p[0], p[1], g, a, redact(e), d) for (p, g, e, a), d in zip(items, delay_ms, strict=True)])

    def due_retries(self, conn: psycopg.Connection, sink: str, limit: int) -> list[tuple[Position, str | None, int]]:
        """Parked messages of groups whose head is due, in log order: (position, group, attempts)."""
        rows = conn.execute(sql.SQL(
            "WITH heads AS (SELECT DISTINCT ON (group_key) group_key, next_attempt_at FROM {s}.failed_messages "
            "  WHERE sink = %s AND status = 'parked' ORDER BY group_key, commit_lsn, commit_idx) "
            "SELECT f.commit_lsn, f.commit_idx, f.group_key, f.attempts FROM {s}.failed_messages f "
            "JOIN heads h ON h.group_key IS NOT DISTINCT FROM f.group_key "
            "WHERE f.sink = %s AND f.status = 'parked' AND h.next_attempt_at <= now() "
            "ORDER BY f.commit_lsn, f.commit_idx LIMIT %s").format(s=self.s), (sink, sink, limit)).fetchall()
        return [((int(r[0]), int(r[1])), r[2], int(r[3])) for r in rows]

    def resolve(self, conn: psycopg.Connection, sink: str, positions: Sequence[Position]) -> None:
        if positions:
            conn.execute(sql.SQL(
                "DELETE FROM {}.failed_messages WHERE sink = %s AND (commit_lsn, commit_idx) IN "
                "(SELECT * FROM unnest(%s::bigint[], %s::int[]))").format(self.s),
                (sink, [p[0] for p in positions], [p[1] for p in positions]))

    def discard(self, conn: psycopg.Connection, sink: str, position: Position, error: str) -> None:
        conn.execute(sql.SQL(
            "UPDATE {}.failed_messages SET status = 'discarded', last_error = %s WHERE sink = %s "
            "AND commit_lsn = %s AND commit_idx = %s").format(self.s), (redact(error), sink, position[0], position[1]))
        conn.execute(sql.SQL("UPDATE {}.sink_offsets SET discarded = discarded + 1 WHERE sink = %s")
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

    def apply_retention(self, conn: psycopg.Connection, hours: float, sinks: Sequence[str]) -> int:
        """Delete log rows older than `hours` that nothing still needs: every sink has passed them
        (a sink that has not started keeps everything), no parked message is one of them, and no
        unreconciled backfill page needs them (see _backfill_floor)."""
        floor: Position = (2**63 - 1, 2**31 - 1)  # no sinks: age alone decides
        if sinks:
            rows = {r[0]: (int(r[1]), int(r[2])) for r in conn.execute(sql.SQL(
                "SELECT sink, commit_lsn, commit_idx FROM {}.sink_offsets WHERE sink = ANY(%s)").format(self.s),
                (list(sinks),)).fetchall()}
            floor = min(rows.get(name, (0, -1)) for name in sinks)  # a sink not started yet keeps all
        low, read_at = self._backfill_floor(conn)
        if low is not None and low <= floor:
            floor = (low[0], low[1] - 1)
        # log_trimmed remembers the newest deleted commit time: replays refuse windows reaching before it.
        row = conn.execute(sql.SQL(
            "WITH d AS (DELETE FROM {s}.change_log l WHERE l.commit_ts < now() - make_interval(secs => %s) "
            "AND (%s::timestamptz IS NULL OR l.commit_ts < %s::timestamptz - interval '1 minute') "
            "AND (l.commit_lsn, l.commit_idx) <= (%s, %s) AND NOT EXISTS (SELECT 1 FROM {s}.failed_messages f "
            "WHERE f.commit_lsn = l.commit_lsn AND f.commit_idx = l.commit_idx AND f.status = 'parked') "
            "RETURNING l.commit_ts), "
            "m AS (INSERT INTO {s}.log_trimmed (trimmed_until) SELECT max(commit_ts) FROM d HAVING count(*) > 0 "
            "ON CONFLICT (one) DO UPDATE SET trimmed_until = greatest({s}.log_trimmed.trimmed_until, "
            "excluded.trimmed_until)) SELECT count(*) FROM d"
        ).format(s=self.s), (hours * 3600, read_at, read_at, floor[0], floor[1])).fetchone()
        return int(row[0]) if row else 0

    def _backfill_floor(self, conn: psycopg.Connection) -> tuple[Position | None, datetime | None]:
        """What unreconciled pages of active backfills still need, as (the earliest low watermark in the
        log, the earliest page read time). Reconciling a page reads the log between its watermarks, and
        before its low watermark the changes of transactions its snapshot could not see: those committed
        just before the page was read, so everything committed since a minute before it is kept."""
        row = conn.execute(sql.SQL(
            "SELECT min(p.read_at), (SELECT array[w.commit_lsn, w.commit_idx] FROM {s}.backfill_low_watermarks w "
            "  JOIN {s}.backfill_pages q USING (backfill_id, page_no) JOIN {s}.backfills c ON c.id = q.backfill_id "
            "  WHERE q.status = 'staged' AND c.status IN ('running', 'paused') "
            "  ORDER BY w.commit_lsn, w.commit_idx LIMIT 1) "
            "FROM {s}.backfill_pages p JOIN {s}.backfills b ON b.id = p.backfill_id "
            "WHERE p.status = 'staged' AND b.status IN ('running', 'paused')").format(s=self.s)).fetchone()
        if row is None:
            return None, None
        return ((int(row[1][0]), int(row[1][1])) if row[1] else None), row[0]


def _pos_params(position: Position | None) -> tuple[int | None, int | None, int | None]:
    return (None, None, None) if position is None else (position[0], position[0], position[1])
