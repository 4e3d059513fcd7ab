"""Retention of the change log: deleting what no sink, parked message or backfill page still needs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg
from psycopg import sql

from cdc_pipeline.core.positions import END, START
from cdc_pipeline.state.base import Position


def trim_log(conn: psycopg.Connection, schema: str, hours: float, sinks: Sequence[str]) -> int:
    """Delete log rows older than `hours` that nothing still needs: every sink has passed them
    (a sink that has not started keeps everything), no parked message is one of them, and no
    unreconciled backfill page needs them (see _backfill_floor)."""
    s = sql.Identifier(schema)
    floor: Position = END  # no sinks: age alone decides
    if sinks:
        rows = {r[0]: (int(r[1]), int(r[2])) for r in conn.execute(sql.SQL(
            "SELECT DISTINCT ON (sink) sink, commit_lsn, commit_idx FROM {}.sink_offsets WHERE sink = ANY(%s) "
            "ORDER BY sink, commit_lsn, commit_idx").format(s),  # a sink with lanes: its slowest lane
            (list(sinks),)).fetchall()}
        floor = min(rows.get(name, START) for name in sinks)  # a sink not started yet keeps all
    low, read_at = _backfill_floor(conn, s)
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
    ).format(s=s), (hours * 3600, read_at, read_at, floor[0], floor[1])).fetchone()
    return int(row[0]) if row else 0


def _backfill_floor(conn: psycopg.Connection, s: sql.Identifier) -> tuple[Position | None, datetime | None]:
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
        "WHERE p.status = 'staged' AND b.status IN ('running', 'paused')").format(s=s)).fetchone()
    if row is None:
        return None, None
    return ((int(row[1][0]), int(row[1][1])) if row[1] else None), row[0]
