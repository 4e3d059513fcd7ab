"""Delivery of one sink: log -> Spark stage -> sink, with parking, retries and per-group order.

Each micro-batch: load the log after the sink's offset, run the Spark stage, hold back messages whose
group already has a parked message, hand the rest to the sink, park what failed (and what is behind it
in its group), then advance the sink's offset past the whole batch. So a poison message never stalls
the other groups, and a group never delivers a message before an earlier one of its own.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO

import psycopg
import pyarrow as pa
from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import SparkSession

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.delivery.arrow_stage import run_arrow_stage
from cdc_pipeline.delivery.backoff import next_delay_ms
from cdc_pipeline.delivery.spark_stage import SinkPlan, empty_output, run_stage
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import OutboundMessage, Sink
from cdc_pipeline.state.store import Position, Store

log = logging.getLogger(__name__)

HELD = "held behind an earlier failed message of its group"
# (position, group, error) of a message the Spark stage could not process.
StageFailure = tuple[Position, str | None, str]
# Errors that fail every row alike (bad expression, unknown column): not worth bisecting.
CONFIG_ERRORS: tuple[type[BaseException], ...] = (AnalysisException, ParseException)
# Spark jobs one batch may spend isolating failing rows: ~2*log2(batch) per poison row.
MAX_STAGE_SPLITS = 128


class SinkBusy(RuntimeError):
    pass


@dataclass(frozen=True)
class Staged:
    """One micro-batch read from the log and through the stage, ready to send."""

    batch: pa.Table
    last: Position  # the batch's last log position: the offset once it is sent
    out: pa.Table
    failed: list[StageFailure]


@dataclass
class DeliveryStats:
    sink: str
    batches: int = 0
    read: int = 0
    delivered: int = 0
    filtered: int = 0
    parked: int = 0
    retried: int = 0
    discarded: int = 0
    seconds: float = 0.0
    offset: Position = (0, -1)
    lag_messages: int = 0

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds else 0.0

    def as_metadata(self) -> dict[str, float | int | str]:
        return {
            "messages_delivered": self.delivered, "messages_parked": self.parked,
            "messages_discarded": self.discarded, "messages_filtered": self.filtered,
            "messages_retried": self.retried, "batches": self.batches,
            "throughput_msgs_per_s": round(self.rate, 1), "lag_messages": self.lag_messages,
            "offset": f"{self.offset[0]}:{self.offset[1]}",
        }


def messages_from(out: pa.Table) -> list[OutboundMessage]:
    cols = [out.column(c).to_pylist() for c in ("commit_lsn", "commit_idx", "group_key", "route", "payload")]
    return [OutboundMessage(f"{lsn}:{idx}", group, route, payload.encode())
            for lsn, idx, group, route, payload in zip(*cols, strict=True)]


def position_of(message: OutboundMessage) -> Position:
    lsn, _, idx = message.key.partition(":")
    return int(lsn), int(idx)


class Deliverer:
    def __init__(self, config: PipelineConfig, sink_config: SinkConfig, spark: SparkSession,
                 sink: Sink | None = None, dry_run: bool = False, dry_run_out: IO[str] | None = None) -> None:
        self.config = config
        self.sink_config = sink_config
        self.spark = spark
        self.store = Store(config.state.schema_name)
        self.plan = SinkPlan.build(config, sink_config)
        self.dry_run = dry_run
        self.dry_run_out = dry_run_out or sys.stdout
        self.sink = None if dry_run else (sink or build_sink(sink_config))
        self.batch_size = sink_config.batch_size or config.delivery.batch_size
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self, until_idle: bool = True, seconds: float | None = None) -> DeliveryStats:
        stats = DeliveryStats(self.sink_config.name)
        started = time.monotonic()
        name = self.sink_config.name
        with psycopg.connect(self.config.state_dsn) as conn:
            got = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))",
                               (f"cdc_pipeline.deliver:{name}",)).fetchone()
            conn.commit()
            if not (got and got[0]) and not self.dry_run:
                raise SinkBusy(f"sink {name!r} is already being delivered by another process")
            if self.sink is not None:
                self.sink.open()
                self.sink.prepare(lambda table: self.store.table_info(conn, table))
            try:
                offset = self.store.sink_offset(conn, name)
                if self.sink is not None:
                    held = self.sink.position()
                    if held is not None and held > offset:  # the sink committed before we did
                        offset = held
                conn.commit()
                offset = self._loop(conn, offset, stats, started, until_idle, seconds)
                stats.offset = offset
                stats.lag_messages = self.store.count_after(conn, self.sink_config.tables, offset, sink=name)
                conn.commit()
            finally:
                if self.sink is not None:
                    self.sink.close()
        stats.seconds = time.monotonic() - started
        return stats

    def _schemas(self, conn: psycopg.Connection) -> dict[str, list[dict[str, object]]]:
        return self.store.relation_columns(conn) if self.plan.needs_record else {}

    def _loop(self, conn: psycopg.Connection, offset: Position, stats: DeliveryStats, started: float,
              until_idle: bool, seconds: float | None) -> Position:
        """Micro-batches until idle (or stopped). The next batch is loaded and staged on a second
        connection while the sink writes the current one: the two mostly wait on different servers."""
        with psycopg.connect(self.config.state_dsn) as loader, ThreadPoolExecutor(1) as pool:
            ahead: Future[Staged] | None = None
            while not self._stop.is_set():
                if seconds is not None and time.monotonic() - started >= seconds:
                    break
                if not self.dry_run:
                    self._retry_due(conn, stats)
                staged = ahead.result() if ahead is not None else self._load_and_stage(loader, offset)
                ahead = None
                if staged.batch.num_rows == 0:
                    if until_idle:
                        break
                    self._stop.wait(self.config.delivery.idle_seconds)
                    continue
                ahead = pool.submit(self._load_and_stage, loader, staged.last)
                offset = self._send(conn, staged, stats)
            if ahead is not None:
                ahead.result()  # let the loader finish before its connection closes
        return offset

    def _load_and_stage(self, conn: psycopg.Connection, offset: Position) -> Staged:
        batch = self.store.load_batch(conn, self.sink_config.tables, offset, self.batch_size,
                                      sink=self.sink_config.name, max_bytes=self.config.delivery.batch_bytes)
        schemas = self._schemas(conn) if batch.num_rows else {}
        conn.commit()
        if batch.num_rows == 0:
            return Staged(batch, offset, empty_output(), [])
        last: Position = (batch.column("commit_lsn")[-1].as_py(), batch.column("commit_idx")[-1].as_py())
        out, stage_failed = self._stage(batch, schemas)
        return Staged(batch, last, out, stage_failed)

    def _send(self, conn: psycopg.Connection, staged: Staged, stats: DeliveryStats) -> Position:
        batch, last, out, stage_failed = staged.batch, staged.last, staged.out, staged.failed
        last_ts = batch.column("commit_ts")[-1].as_py()
        messages = messages_from(out)
        stats.batches += 1
        stats.read += batch.num_rows
        filtered = batch.num_rows - len(messages) - len(stage_failed)
        stats.filtered += filtered
        if self.dry_run:
            for m in messages:
                self.dry_run_out.write(m.payload.decode() + "\n")
            stats.delivered += len(messages)
            return last
        name = self.sink_config.name
        blocked = self.store.parked_groups(conn, name) if self.sink_config.message_grouping else set()
        # A message the stage could not process blocks the later messages of its group too.
        blocked |= {g for _, g, _ in stage_failed if g is not None}
        send = [m for m in messages if m.group is None or m.group not in blocked]
        held = [m for m in messages if m.group is not None and m.group in blocked]
        results = self._deliver(send)
        parked = self._park_failures(conn, send, results, held, stage_failed)
        delivered = sum(1 for r in results if r is None)
        self.store.advance_offset(conn, name, last, delivered, filtered, parked, last_ts)
        conn.commit()
        stats.delivered += delivered
        stats.parked += parked
        return last

    def _deliver(self, messages: Sequence[OutboundMessage]) -> list[str | None]:
        if not messages:
            return []
        assert self.sink is not None
        results = self.sink.deliver(messages)
        if len(results) != len(messages):
            raise RuntimeError(f"sink {self.sink_config.name!r} returned {len(results)} results "
                               f"for {len(messages)} messages")
        return results

    def _stage(self, batch: pa.Table, schemas: dict[str, list[dict[str, object]]]
               ) -> tuple[pa.Table, list[StageFailure]]:
        """Run the Spark stage; when it fails at run time (a transform raising on some row), bisect the
        batch to find the rows that make it fail, so only those are parked, not the batch."""
        if not self.plan.needs_record:
            return run_arrow_stage(self.plan, batch), []  # nothing for Spark to compute (arrow_stage.py)
        budget = [MAX_STAGE_SPLITS]
        return self._stage_bisect(batch, schemas, budget)

    def _stage_bisect(self, batch: pa.Table, schemas: dict[str, list[dict[str, object]]], budget: list[int]
                      ) -> tuple[pa.Table, list[StageFailure]]:
        try:
            return run_stage(self.spark, self.plan, batch, schemas), []
        except CONFIG_ERRORS:
            raise  # a bad expression fails every row: a config problem, not a poison message
        except Exception as exc:
            budget[0] -= 1
            if budget[0] < 0:
                # So many rows fail that it is the environment or the code, not a few poison messages:
                # fail the run (the offset stays) rather than park everything.
                raise
            if batch.num_rows == 1:
                row = batch.to_pylist()[0]
                group = (f"{row['table_schema']}|{row['table_name']}|{row['pk']}"
                         if self.sink_config.message_grouping else None)
                error = f"transform failed: {type(exc).__name__}: {_cause(exc)}"
                return empty_output(), [((row["commit_lsn"], row["commit_idx"]), group, error)]
            mid = batch.num_rows // 2
            left, lf = self._stage_bisect(batch.slice(0, mid), schemas, budget)
            right, rf = self._stage_bisect(batch.slice(mid), schemas, budget)
            return pa.concat_tables([left.cast(right.schema), right]), lf + rf

    def _park_failures(self, conn: psycopg.Connection, sent: Sequence[OutboundMessage],
                       results: Sequence[str | None], held: Sequence[OutboundMessage],
                       stage_failed: Sequence[StageFailure] = ()) -> int:
        backoff = self.sink_config.backoff
        failed_groups: set[str | None] = set()
        items: list[tuple[Position, str | None, str, int]] = []
        for pos, group, err in sorted(stage_failed):
            group = group if group is not None else f"~{pos[0]}:{pos[1]}"
            first = group not in failed_groups
            failed_groups.add(group)
            items.append((pos, group, err if first else HELD, 1 if first else 0))
        for m, err in zip(sent, results, strict=True):
            if err is None:
                continue
            group = m.group if m.group is not None else f"~{m.key}"  # ungrouped: its own group
            first = group not in failed_groups
            failed_groups.add(group)
            items.append((position_of(m), group, err if first else HELD, 1 if first else 0))
        items += [(position_of(m), m.group, HELD, 0) for m in held]
        items.sort(key=lambda it: it[0])
        delays = [next_delay_ms(max(1, a), backoff.initial_ms, backoff.max_ms, backoff.multiplier, backoff.jitter)
                  if a else 0 for _, _, _, a in items]
        self.store.park(conn, self.sink_config.name, items, delays)
        return len(items)

    def _retry_due(self, conn: psycopg.Connection, stats: DeliveryStats) -> None:
        due = self.store.due_retries(conn, self.sink_config.name, self.batch_size)
        if not due:
            conn.commit()
            return
        attempts = {pos: a for pos, _, a in due}
        groups = {pos: g for pos, g, _ in due}
        batch = self.store.load_positions(conn, [pos for pos, _, _ in due])
        out, stage_failed = self._stage(batch, self._schemas(conn))
        failed_at = {pos: err for pos, _, err in stage_failed}
        messages = messages_from(out)
        kept = {position_of(m) for m in messages} | set(failed_at)
        resolved = [pos for pos in attempts if pos not in kept]  # now filtered out: nothing to deliver
        for m in messages:  # the group a message was parked under is the one that orders it
            m.group = groups[position_of(m)]
        # Nothing is sent behind a message of its group that the stage could not process.
        first_failure: dict[str | None, Position] = {}
        for pos in sorted(failed_at):
            first_failure.setdefault(groups[pos], pos)
        sendable = [m for m in messages
                    if m.group not in first_failure or position_of(m) < first_failure[m.group]]
        results = dict(zip(map(position_of, sendable), self._deliver(sendable), strict=True))
        results.update(failed_at)
        backoff = self.sink_config.backoff
        failed_groups: set[str | None] = set()
        name = self.sink_config.name
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
            tries = attempts[pos] + 1
            limit = self.sink_config.max_retries
            if limit is not None and tries > limit:
                self.store.discard(conn, name, pos, f"gave up after {tries - 1} retries: {err}")
                stats.discarded += 1
            else:
                delay = next_delay_ms(tries, backoff.initial_ms, backoff.max_ms, backoff.multiplier, backoff.jitter)
                self.store.park(conn, name, [(pos, group, err, tries)], [delay])
        self.store.resolve(conn, name, resolved)
        conn.commit()


def _cause(exc: BaseException) -> str:
    """The informative line of a Spark error: for a Python worker failure the traceback's last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    tb = [line for line in lines if not line.startswith(("File ", "^", "~"))]
    line = tb[-1] if "Traceback" in str(exc) and tb else lines[0]
    return line[:400]

