"""Reads of the change log for delivery: batches after a sink's offset, counts, its head and its lag."""

from __future__ import annotations

import io
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime

import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql

from cdc_pipeline.state import typed_log, typed_records
from cdc_pipeline.state.base import Position
from cdc_pipeline.state.log_counts import LogCounts, sink_params

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


def copy_arrow(conn: psycopg.Connection, query: sql.Composable, params: Sequence[object],
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


# A lane's share of the log (core/lanes.py, MD5 lane hash): the first four bytes of the MD5 of each row's parking
# group, as lanes.lane_of computes them, modulo the number of lanes. Grouped: table and key (the default group);
# ungrouped: the row's own "~lsn:idx".
_LANE_GROUPED = "concat_ws('|', l.table_schema, l.table_name, l.pk)"
_LANE_UNGROUPED = "concat('~', l.commit_lsn, ':', l.commit_idx)"
_LANE = "('x' || left(md5(convert_to({group}, 'UTF8')), 8))::bit(32)::bigint %% %s = %s"
_LANE_COLUMNS = [pa.field("_own", pa.int8()), pa.field("_n", pa.int64())]


@dataclass(frozen=True)
class LaneShare:
    """Which lane's rows a read selects: lane ``lane`` of ``lanes``, by the group table and key (``grouped``)
    or by the row's position (a sink with `message_grouping: false`)."""

    lane: int
    lanes: int
    grouped: bool


@dataclass(frozen=True)
class LaneBlock:
    """A block of the log read for one lane: its own rows, and how far the block covered the log (all lanes'
    rows): the position and commit time of the last row it covered, and how many rows it covered."""

    batch: pa.Table
    end: Position | None  # None: the log holds nothing after the offset
    end_ts: datetime | None
    covered: int


class ChangeLog(LogCounts):
    """The `change_log` table as delivery reads it: a sink sees its tables' changes and the backfill reads
    meant for it (``routing``, log_counts.py), in position order, loaded as Arrow."""

    def select(self, conn: psycopg.Connection, where: sql.Composable, params: Sequence[object]) -> pa.Table:
        """The log rows that ``where`` (the query's tail from WHERE on) selects, as LOG_ARROW_SCHEMA: typed
        reads with their records made from the typed rows."""
        return copy_arrow(conn, sql.SQL(_SELECT).format(self.s) + where, params)

    def load_batch(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, limit: int,
                   sink: str | None = None, max_bytes: int | None = None, typed: bool = False) -> pa.Table:
        """Up to ``limit`` messages after ``after``; with ``max_bytes``, also stop once the messages so far
        hold that many bytes of record and changes JSON (always at least one message). ``typed``: typed
        reads keep their typed row (column ``tup``, record null) instead of being turned into JSON."""
        where = sql.SQL("WHERE (commit_lsn, commit_idx) > (%s, %s) AND table_schema || '.' || table_name = ANY(%s) "
                        "{routing}ORDER BY commit_lsn, commit_idx LIMIT %s").format(routing=self.routing(sink))
        params: tuple[object, ...] = (after[0], after[1], list(tables), *sink_params(sink), limit)
        # Typed reads are loaded as they are; for JSON they are turned into records here (typed_records.py).
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
        batch = copy_arrow(conn, query, params, LOG_ARROW_SCHEMA_TYPED)
        return batch if typed else typed_records.with_records(conn, self.schema, batch)

    def load_lane_block(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, limit: int,
                        share: LaneShare, sink: str | None = None, max_bytes: int | None = None,
                        typed: bool = False) -> LaneBlock:
        """Like load_batch, for one lane of a split hashed in SQL (core/lanes.py): of up to ``limit`` log rows
        after ``after`` (and, with ``max_bytes``, while this lane's rows so far hold fewer bytes), only the lane's
        own are sent and parsed; the block's end tells how far the lane may move its offset. The server still
        scans the other lanes' rows (an index scan of the key), but does not turn them into text."""
        lane = sql.SQL(_LANE.format(group=_LANE_GROUPED if share.grouped else _LANE_UNGROUPED))
        size = ("CASE WHEN w._own THEN coalesce(octet_length(w.record::text), octet_length(w.tup), 0) "
                "+ coalesce(octet_length(w.changes::text), 0) ELSE 0 END")
        columns = _SELECT_TYPED.replace("FROM {0}.change_log ", "")
        query = sql.SQL(columns + ", _own::int, _n FROM (SELECT b.*, row_number() OVER o AS _n, "
                        "lead(b.commit_lsn) OVER o IS NULL AS _end FROM (SELECT w.*, ").format(self.s) + sql.SQL(
            f"sum({size}) OVER (ORDER BY w.commit_lsn, w.commit_idx ROWS UNBOUNDED PRECEDING) AS _total, "
            f"{size} AS _bytes FROM (SELECT l.*, ") + lane + sql.SQL(
            " AS _own FROM {}.change_log l WHERE (l.commit_lsn, l.commit_idx) > (%s, %s) "
            "AND l.table_schema || '.' || l.table_name = ANY(%s) {routing}ORDER BY l.commit_lsn, l.commit_idx "
            "LIMIT %s) w) b WHERE b._total - b._bytes < %s WINDOW o AS (ORDER BY b.commit_lsn, b.commit_idx)) c "
            "WHERE c._own OR c._end ORDER BY commit_lsn, commit_idx").format(self.s, routing=self.routing(sink))
        params = (share.lanes, share.lane, after[0], after[1], list(tables), *sink_params(sink), limit,
                  max_bytes if max_bytes is not None else 1 << 62)
        typed_log.scan_in_log_order(conn)
        rows = copy_arrow(conn, query, params, pa.schema([*LOG_ARROW_SCHEMA_TYPED, *_LANE_COLUMNS]))
        if rows.num_rows == 0:
            return LaneBlock(LOG_ARROW_SCHEMA_TYPED.empty_table() if typed else LOG_ARROW_SCHEMA.empty_table(),
                             None, None, 0)
        last = rows.num_rows - 1
        end = (rows.column("commit_lsn")[last].as_py(), rows.column("commit_idx")[last].as_py())
        end_ts, covered = rows.column("commit_ts")[last].as_py(), rows.column("_n")[last].as_py()
        if not rows.column("_own")[last].as_py():  # the block's last row, another lane's: only its position counts
            rows = rows.slice(0, last)
        batch = rows.drop_columns(["_own", "_n"])
        return LaneBlock(batch if typed else typed_records.with_records(conn, self.schema, batch), end, end_ts, covered)

    def head_run(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, limit: int,
                 sink: str) -> typed_log.TypedRun | None:
        """The run of typed reads, or of other messages, at the head of a sink's log (state/typed_log.py): read
        off the reconciled pages' positions when it is their reads alone, else found with a scan."""
        typed_log.scan_in_log_order(conn)
        run = typed_log.page_run(conn, self.schema, tables, sink, after, limit)
        if run is not None:
            return run
        return typed_log.head_run(conn, self.schema, self.routing(sink), (list(tables), sink), after, limit)

    def relay_rows(self, conn: psycopg.Connection, tables: Sequence[str], after: Position, run: typed_log.TypedRun,
                   sink: str) -> AbstractContextManager[typed_log.RunRows]:
        """A typed run's rows, relayed as COPY text blocks to a sink that writes them as they are."""
        return typed_log.relay_rows(conn, self.schema, self.routing(sink), (list(tables), sink), after, run)

    def load_positions(self, conn: psycopg.Connection, positions: Sequence[Position]) -> pa.Table:
        return self.select(conn, sql.SQL(
            "WHERE (commit_lsn, commit_idx) IN (SELECT * FROM unnest(%s::bigint[], %s::int[])) "
            "ORDER BY commit_lsn, commit_idx"), ([p[0] for p in positions], [p[1] for p in positions]))
