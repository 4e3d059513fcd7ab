"""The pull consumers' queue in the state database (table `pull_queue`, migration 3).

One statement per call, so `serve` processes sharing a database stay correct and fast:

* enqueue: the delivery engine COPYs a batch in, inside the transaction that advances the sink's offset
  (so a crash can neither lose nor duplicate a batch), and notifies waiting `serve` processes.
* receive: the oldest available messages that are the head of their group (no earlier message of the
  group is still queued: acked rows are deleted, so an outstanding or nacked earlier one blocks it),
  locked with SKIP LOCKED so concurrent receivers never hand out one message twice, and leased until
  now + visibility timeout. A message that comes back after `max_deliveries` is parked instead.
* ack / nack: by ack id `<id>.<delivery number>`; an id whose lease expired, or that was handed out
  again since, is stale and reported back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from cdc_pipeline.state.base import SchemaStore

NOTIFY_CHANNEL = "cdc_pipeline_pull"
MAX_BIGINT = 2**63 - 1
MAX_INT = 2**31 - 1


def parse_ack_id(ack_id: str) -> tuple[int, int] | None:
    """(row id, delivery number) of a well-formed ack id; None for anything that can never match a row."""
    head, dot, tail = ack_id.partition(".")
    if not (dot and head.isascii() and head.isdigit() and tail.isascii() and tail.isdigit()):
        return None
    row, delivery = int(head), int(tail)
    if row > MAX_BIGINT or delivery > MAX_INT:
        return None
    return row, delivery


@dataclass(frozen=True)
class Received:
    ack_id: str
    payload: str


class PullQueue(SchemaStore):
    # -- the delivery side (sync, the engine's transaction) ---------------------------------------
    def enqueue(self, conn: psycopg.Connection, consumer: str,
                rows: Sequence[tuple[int, int, str | None, str]]) -> None:
        """rows: (commit_lsn, commit_idx, group, payload) in commit order. Not committed here."""
        with conn.cursor() as cur, cur.copy(sql.SQL(
                "COPY {}.pull_queue (consumer, commit_lsn, commit_idx, group_key, payload) FROM STDIN")
                .format(self.s)) as copy:
            for lsn, idx, group, payload in rows:
                copy.write_row((consumer, lsn, idx, group, payload))
        conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, consumer))

    def counts(self, conn: psycopg.Connection, consumer: str) -> dict[str, int]:
        row = conn.execute(sql.SQL(
            "SELECT count(*) FILTER (WHERE NOT parked AND visible_at <= now()), "
            "count(*) FILTER (WHERE NOT parked AND visible_at > now()), count(*) FILTER (WHERE parked) "
            "FROM {}.pull_queue WHERE consumer = %s").format(self.s), (consumer,)).fetchone()
        assert row is not None
        return {"waiting": int(row[0]), "in_flight": int(row[1]), "parked": int(row[2])}

    # -- parked messages, for `failed list|retry|discard` (one place for every sink type) ----------
    def list_parked(self, conn: psycopg.Connection, consumer: str | None) -> list[dict[str, object]]:
        """Parked messages in the shape of FailedMessages.list_failed's rows. A parked pull message is not
        retried on its own: `retry` makes it available again, `discard` deletes it (freeing its group)."""
        rows = conn.execute(sql.SQL(
            "SELECT consumer, commit_lsn, commit_idx, group_key, deliveries, enqueued_at FROM {}.pull_queue "
            "WHERE parked AND (%s::text IS NULL OR consumer = %s) ORDER BY consumer, id").format(self.s),
            (consumer, consumer)).fetchall()
        return [{"sink": r[0], "commit_lsn": r[1], "commit_idx": r[2], "group_key": r[3], "status": "parked",
                 "attempts": r[4], "last_error": f"not acknowledged after {r[4]} deliveries (max_deliveries)",
                 "first_failed_at": r[5], "next_attempt_at": None, "id": f"{r[1]}:{r[2]}"} for r in rows]

    def unpark(self, conn: psycopg.Connection, consumer: str | None,
               position: tuple[int, int] | None) -> int:
        """Parked messages available to consumers again, counting deliveries from zero. Not committed."""
        cur = conn.execute(sql.SQL(
            "UPDATE {}.pull_queue SET parked = false, deliveries = 0, visible_at = '-infinity' WHERE parked "
            "AND (%s::text IS NULL OR consumer = %s) AND (%s::bigint IS NULL OR (commit_lsn, commit_idx) = "
            "(%s, %s)) RETURNING consumer").format(self.s), (consumer, consumer, *_position(position)))
        woken = {r[0] for r in cur.fetchall()}
        for name in woken:  # long-polls waiting for this consumer look again
            conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, name))
        return cur.rowcount

    def drop_parked(self, conn: psycopg.Connection, consumer: str | None,
                    position: tuple[int, int] | None) -> list[str]:
        """Delete parked messages (their groups flow on; counted in the sink's `discarded`); the
        consumer of each one deleted. Not committed."""
        rows = conn.execute(sql.SQL(
            "DELETE FROM {}.pull_queue WHERE parked AND (%s::text IS NULL OR consumer = %s) "
            "AND (%s::bigint IS NULL OR (commit_lsn, commit_idx) = (%s, %s)) RETURNING consumer")
            .format(self.s), (consumer, consumer, *_position(position))).fetchall()
        for name in {r[0] for r in rows}:
            conn.execute(sql.SQL("UPDATE {}.sink_offsets SET discarded = discarded + %s WHERE sink = %s AND lane = 0")
                         .format(self.s), (sum(1 for r in rows if r[0] == name), name))
            conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, name))
        return [r[0] for r in rows]

    # -- the serving side (async) -----------------------------------------------------------------
    @property
    def receive_sql(self) -> sql.Composed:
        # Parking happens when a message is about to go out again after max_deliveries: the row is
        # updated (parked, never visible again) but not returned to the client.
        return sql.SQL(
            "WITH picked AS (SELECT q.ctid AS tid FROM {s}.pull_queue q "
            "  WHERE q.consumer = %(c)s AND NOT q.parked AND q.visible_at <= now() "
            "  AND (q.group_key IS NULL OR NOT EXISTS (SELECT 1 FROM {s}.pull_queue e "
            "       WHERE e.consumer = q.consumer AND e.group_key = q.group_key AND e.id < q.id)) "
            "  ORDER BY q.id LIMIT %(n)s FOR UPDATE OF q SKIP LOCKED) "
            "UPDATE {s}.pull_queue q SET "
            "  parked = coalesce(q.deliveries >= %(max)s::int, false), "
            "  deliveries = q.deliveries + (NOT coalesce(q.deliveries >= %(max)s::int, false))::int, "
            "  visible_at = CASE WHEN coalesce(q.deliveries >= %(max)s::int, false) THEN 'infinity' "
            "    ELSE clock_timestamp() + make_interval(secs => %(vt)s / 1000.0) END "
            "FROM picked WHERE q.ctid = picked.tid "
            "RETURNING q.id, q.deliveries, q.parked, q.payload").format(s=self.s)

    @property
    def ack_sql(self) -> sql.Composed:
        # Joined to the (id, delivery) pairs: a primary-key probe per id, no text built per row.
        return sql.SQL(
            "DELETE FROM {}.pull_queue q USING unnest(%s::bigint[], %s::int[]) a(id, d) "
            "WHERE q.consumer = %s AND q.id = a.id AND q.deliveries = a.d AND NOT q.parked "
            "AND q.visible_at > now() RETURNING q.id, q.deliveries").format(self.s)

    @property
    def nack_sql(self) -> sql.Composed:
        return sql.SQL(
            "UPDATE {}.pull_queue q SET visible_at = now() FROM unnest(%s::bigint[], %s::int[]) a(id, d) "
            "WHERE q.consumer = %s AND q.id = a.id AND q.deliveries = a.d AND NOT q.parked "
            "AND q.visible_at > now() RETURNING q.id, q.deliveries").format(self.s)

    async def receive(self, conn: psycopg.AsyncConnection, consumer: str, batch_size: int,
                      visibility_timeout_ms: int, max_deliveries: int | None) -> list[Received]:
        cur = await conn.execute(self.receive_sql, {"c": consumer, "n": batch_size, "max": max_deliveries,
                                                    "vt": visibility_timeout_ms})
        rows = await cur.fetchall()
        rows.sort(key=lambda r: r[0])  # RETURNING order is not guaranteed; commit order is the contract
        return [Received(f"{r[0]}.{r[1]}", r[3]) for r in rows if not r[2]]

    async def settle(self, conn: psycopg.AsyncConnection, consumer: str, ack_ids: Sequence[str],
                     nack: bool = False) -> tuple[int, list[str]]:
        """Ack (delete) or nack (make available now) by ack id: (how many matched, the stale ids)."""
        parsed = [parse_ack_id(a) for a in ack_ids]
        valid = [p for p in parsed if p is not None]
        done: set[tuple[int, int]] = set()
        if valid:
            cur = await conn.execute(self.nack_sql if nack else self.ack_sql,
                                     ([p[0] for p in valid], [p[1] for p in valid], consumer))
            done = {(r[0], r[1]) for r in await cur.fetchall()}
            if nack and done:
                await conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, consumer))
        stale = [a for a, p in zip(ack_ids, parsed, strict=True) if p is None or p not in done]
        return len(done), stale


def _position(position: tuple[int, int] | None) -> tuple[int | None, int | None, int | None]:
    return (None, None, None) if position is None else (position[0], position[0], position[1])
