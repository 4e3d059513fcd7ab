"""Parking and retrying failed messages, per group and in order: the Deliverer's parking lot.

A group's first failure is parked with its error (counted against `max_retries` unless it says the
destination did not answer, see outage.py), the group's later messages are parked behind it as held;
due groups are retried in log order, RETRY_CHUNK messages at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import psycopg
import pyarrow as pa

from cdc_pipeline.config import SinkConfig
from cdc_pipeline.core.backoff import next_delay_ms
from cdc_pipeline.core.lanes import parking_group
from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.outage import Liveness
from cdc_pipeline.delivery.schedule.order import HELD, position_of, split_held
from cdc_pipeline.delivery.staging import NotIsolated, StageFailure, Stager
from cdc_pipeline.delivery.stats import DeliveryStats
from cdc_pipeline.sinks.base import OutboundMessage, TypedRow
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline.state.failed_messages import FailedMessages
from cdc_pipeline.state.typed_rows import Columns

# Parked messages due for a retry are staged this many at a time: a transform failing on several of
# them then costs a bounded bisection, not one over everything due.
RETRY_CHUNK = 256


def messages_from(out: pa.Table, shapes: Mapping[str, Columns] | None = None) -> list[OutboundMessage]:
    """The stage's output as messages; typed reads (a ``tup`` column, with their backfills' ``shapes``)
    carry their typed row."""
    cols = [out.column(c).to_pylist() for c in ("commit_lsn", "commit_idx", "group_key", "route", "payload")]
    if "tup" not in out.column_names or out.column("tup").null_count == out.num_rows:
        return [OutboundMessage(f"{lsn}:{idx}", group, route, payload.encode())
                for lsn, idx, group, route, payload in zip(*cols, strict=True)]
    # A typed read without its shape fails here (KeyError), never goes out as a record null.
    shaped: dict[tuple[str, str, str], tuple[str, str, Columns]] = {}
    messages: list[OutboundMessage] = []
    for lsn, idx, group, route, payload, tup, schema, table, bid in zip(
            *cols, *(out.column(c).to_pylist() for c in ("tup", "table_schema", "table_name", "backfill_id")),
            strict=True):
        m = OutboundMessage(f"{lsn}:{idx}", group, route, payload.encode())
        if tup is not None:
            where = shaped.get((schema, table, bid))
            if where is None:
                where = shaped[(schema, table, bid)] = (schema, table, (shapes or {})[bid])
            m.typed = TypedRow(*where, tup)
        messages.append(m)
    return messages


Send = Callable[[Sequence[OutboundMessage]], list[str | None]]  # per message: None, its error, or HELD


class ParkingLot:
    """One sink's parked messages: parks a batch's failures and retries the due ones through ``stager`` and
    ``send`` (the Deliverer's), sharing its view of the destination's liveness."""

    def __init__(self, sink_config: SinkConfig, lane: int, failed: FailedMessages, change_log: ChangeLog,
                 live: Liveness, stager: Stager, send: Send, retry_chunk: int) -> None:
        self.sink_config = sink_config
        self.lane = lane  # its lane's parked messages only (core/lanes.py)
        self.failed = failed
        self.change_log = change_log  # the due messages' log rows
        self.live = live
        self.stager = stager
        self.send = send
        self.retry_chunk = retry_chunk

    def parked_groups(self, conn: psycopg.Connection) -> set[str | None]:
        """The groups of its lane with a parked message: their later messages wait behind it."""
        return self.failed.parked_groups(conn, self.sink_config.name, self.lane)

    def park_failures(self, conn: psycopg.Connection, sent: Sequence[OutboundMessage],
                       results: Sequence[str | None], held: Sequence[OutboundMessage],
                       stage_failed: Sequence[StageFailure] = ()) -> int:
        """Park what failed (a group's first failure with its error, the rest of the group as held) and
        what was held back; discard at once what fails with `max_retries: 0`."""
        failed_groups: set[str | None] = set()
        items: list[tuple[Position, str | None, str, int]] = []
        for pos, group, err in sorted(stage_failed):
            group = parking_group(group, pos)
            first = group not in failed_groups
            failed_groups.add(group)
            items.append((pos, group, err if first else HELD, 1 if first and not isinstance(err, NotIsolated) else 0))
        tried: list[Position] = []
        for m, err in zip(sent, results, strict=True):
            if err is None:
                continue
            pos = position_of(m)
            group = parking_group(m.group, pos)  # ungrouped: its own group
            first = group not in failed_groups
            failed_groups.add(group)
            # An unanswered message next to acknowledged ones is not yet known to be the culprit.
            counted = first and self.live.counts(pos, err)
            items.append((pos, group, err if first else HELD, 1 if counted else 0))
            if first:
                tried.append(pos)
        self.live.tried(tried)
        items += [(position_of(m), m.group, HELD, 0) for m in held]
        items.sort(key=lambda it: it[0])
        self.failed.park(conn, self.sink_config.name, items, [self._delay(max(1, a)) for _, _, _, a in items],
                         self.lane)
        if self.sink_config.max_retries == 0:  # no retries: the first counted failure is final
            for pos, _, err, attempts in items:
                if attempts:
                    self.failed.discard(conn, self.sink_config.name, pos, f"failed (max_retries: 0): {err}")
        return len(items)

    def _delay(self, attempt: int) -> int:
        b = self.sink_config.backoff
        return next_delay_ms(attempt, b.initial_ms, b.max_ms, b.multiplier, b.jitter)

    def retry_due(self, conn: psycopg.Connection, stats: DeliveryStats) -> None:
        due = self.failed.due_retries(conn, self.sink_config.name, self.retry_chunk, self.lane)
        if not due:
            conn.commit()
            return
        attempts = {pos: a for pos, _, a in due}
        groups = {pos: g for pos, g, _ in due}
        batch = self.change_log.load_positions(conn, [pos for pos, _, _ in due])
        out, stage_failed = self.stager.stage(batch, self.stager.schemas(conn))
        failed_at = {pos: err for pos, _, err in stage_failed}
        messages = messages_from(out)
        kept = {position_of(m) for m in messages} | set(failed_at)
        resolved = [pos for pos in attempts if pos not in kept]  # now filtered out: nothing to deliver
        for m in messages:  # the group a message was parked under is the one that orders it
            m.group = groups[position_of(m)]
        # Nothing is sent behind a message of its group that the stage could not process.
        sendable, _ = split_held(messages, (), [(pos, groups[pos]) for pos in failed_at])
        sent = self.send(sendable)  # retries are behind the offset: no position to keep back
        results = dict(zip(map(position_of, sendable), sent, strict=True))
        results.update(failed_at)
        failed_groups: set[str | None] = set()
        name = self.sink_config.name
        limit = self.sink_config.max_retries
        tried: list[Position] = []
        for pos in sorted(results):
            group, err = groups[pos], results[pos]
            if group in failed_groups:
                continue  # stays parked behind its group's head
            if err is None:
                resolved.append(pos)
                stats.retried += 1
                stats.delivered += 1
                continue
            failed_groups.add(group)
            tried.append(pos)
            # A destination that answered nobody is down: the attempt is not the message's fault.
            counted = self.live.counts(pos, err) and not isinstance(err, NotIsolated)
            tries = attempts[pos] + (1 if counted else 0)
            if limit is not None and tries > limit:
                self.failed.discard(conn, name, pos, f"gave up after {tries - 1} retries: {err}")
                stats.discarded += 1
            else:
                self.failed.park(conn, name, [(pos, group, err, tries)], [self._delay(max(1, tries))], self.lane)
        self.live.tried(tried)
        self.live.forget(resolved)
        self.failed.resolve(conn, name, resolved)
        conn.commit()
