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
from cdc_pipeline.delivery.outage import DestinationDown, Liveness, all_down, transient
from cdc_pipeline.delivery.spark_stage import SinkPlan, empty_output, group_keys, run_stage
from cdc_pipeline.postgres import session
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import OutboundMessage, Sink
from cdc_pipeline.state.store import Position, Store

log = logging.getLogger(__name__)

HELD = "held behind an earlier failed message of its group"
MAX_POS: Position = (2**63 - 1, 2**31 - 1)
# (position, group, error) of a message the Spark stage could not process.
StageFailure = tuple[Position, str | None, str]
# Errors that fail every row alike (bad expression, unknown column): not worth bisecting.
CONFIG_ERRORS: tuple[type[BaseException], ...] = (AnalysisException, ParseException)
# Spark jobs one batch may spend isolating failing rows: ~2*log2(batch) per poison row. Past it, the
# rows not yet isolated are parked together (not counted against their retries) instead of failing the run.
MAX_STAGE_SPLITS = 128
# Parked messages due for a retry are staged this many at a time: a transform failing on several of
# them then costs a bounded bisection, not one over everything due.
RETRY_CHUNK = 256


class NotIsolated(str):
    """A transform error of a row that was parked with others before the bisection isolated it."""

    __slots__ = ()


class SinkBusy(RuntimeError):
    pass


class _LockStillHeld(RuntimeError):
    """After a reconnect the sink's lock is still held: most likely by our own old session."""


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
    outage_retries: int = 0  # times the run waited for the destination or the state database
    waiting: str | None = None  # why the run was still waiting when it ended

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds else 0.0

    def as_metadata(self) -> dict[str, float | int | str]:
        return {
            "messages_delivered": self.delivered, "messages_parked": self.parked,
            "messages_discarded": self.discarded, "messages_filtered": self.filtered,
            "messages_retried": self.retried, "batches": self.batches,
            "throughput_msgs_per_s": round(self.rate, 1), "lag_messages": self.lag_messages,
            "offset": f"{self.offset[0]}:{self.offset[1]}", "outage_retries": self.outage_retries,
            **({"waiting_for_destination": self.waiting} if self.waiting else {}),
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
        self._live = Liveness()
        self._waiting = False  # a wait for the destination is recorded in the state database

    def stop(self) -> None:
        self._stop.set()

    def run(self, until_idle: bool = True, seconds: float | None = None) -> DeliveryStats:
        """Deliver until idle (``until_idle``), stopped or ``seconds`` have passed. A long-running delivery
        rides through its destination or the state database being down: it waits with capped backoff,
        logs and records (for `status`) what it waits for, and resumes from its committed offset. With
        ``until_idle`` such an outage ends the run with the error instead (a one-off catch-up)."""
        stats = DeliveryStats(self.sink_config.name)
        started = time.monotonic()
        deadline = started + seconds if seconds is not None else None
        cfg = self.config.delivery
        attempt = 0
        sessions = 0
        try:
            while not self._stop.is_set():
                before = (stats.delivered, stats.parked, stats.retried)
                try:
                    sessions += 1
                    self._session(stats, started, until_idle, seconds, first=sessions == 1)
                    break
                except Exception as exc:
                    if until_idle or self.dry_run or not (transient(exc) or isinstance(exc, _LockStillHeld)):
                        raise
                    progressed = (stats.delivered, stats.parked, stats.retried) != before
                    attempt = 1 if progressed else attempt + 1
                    delay = next_delay_ms(attempt, cfg.retry_initial_ms, cfg.retry_max_ms) / 1000
                    cause = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
                    stats.outage_retries += 1
                    stats.waiting = cause
                    what = "the state database" if isinstance(exc, psycopg.Error) else "the destination"
                    log.warning("deliver: sink %s: waiting for %s: %s; retry %d in %.1f s", self.sink_config.name,
                                what, cause, attempt, delay)
                    self._record_waiting(cause)
                    if deadline is not None and time.monotonic() + delay >= deadline:
                        break  # a time-limited run ends waiting; the next one starts over
                    if self._stop.wait(delay):
                        break
        finally:
            if stats.outage_retries:
                self._record_waiting(None)
        stats.seconds = time.monotonic() - started
        return stats

    def _record_waiting(self, reason: str | None) -> None:
        """Best effort: the state database may be what is down."""
        try:
            with session.connect(self.config.state_dsn, autocommit=True, statement_timeout_ms=5000) as conn:
                self.store.set_waiting(conn, self.sink_config.name, reason)
        except psycopg.Error as exc:
            log.debug("deliver: sink %s: cannot record waiting: %s", self.sink_config.name, type(exc).__name__)
        self._waiting = reason is not None

    def _session(self, stats: DeliveryStats, started: float, until_idle: bool, seconds: float | None,
                 first: bool) -> None:
        name = self.sink_config.name
        with session.connect(self.config.state_dsn, application_name=f"cdc-pipeline deliver {name}") as conn:
            if not session.try_lock(conn, f"cdc_pipeline.deliver:{name}") and not self.dry_run:
                if not first:
                    raise _LockStillHeld(f"the delivery lock of sink {name!r} is still held")
                raise SinkBusy(f"sink {name!r} is already being delivered by another process")
            conn.commit()
            try:
                if self.sink is not None:
                    self.sink.open()
                    self.sink.prepare(lambda table: self.store.table_info(conn, table))
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
                stats.waiting = None
            finally:
                if self.sink is not None:
                    self.sink.close()

    def _schemas(self, conn: psycopg.Connection) -> dict[str, list[dict[str, object]]]:
        return self.store.relation_columns(conn) if self.plan.needs_record else {}

    def _loop(self, conn: psycopg.Connection, offset: Position, stats: DeliveryStats, started: float,
              until_idle: bool, seconds: float | None) -> Position:
        """Micro-batches until idle (or stopped). The next batch is loaded and staged on a second
        connection while the sink writes the current one: the two mostly wait on different servers."""
        with session.connect(self.config.state_dsn) as loader, ThreadPoolExecutor(1) as pool:
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
                                      sink=self.sink_config.name)
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
        first_failed: dict[str, Position] = {}
        for pos, g, _ in stage_failed:
            if g is not None:
                first_failed[g] = min(pos, first_failed.get(g, pos))

        def is_held(m: OutboundMessage) -> bool:
            return m.group is not None and (m.group in blocked or position_of(m) > first_failed.get(m.group, MAX_POS))

        send = [m for m in messages if not is_held(m)]
        held = [m for m in messages if is_held(m)]
        # Those are parked only by the state commit below: the sink must not record a position past them.
        kept_back = [position_of(m) for m in held] + [pos for pos, _, _ in stage_failed]
        assert self.sink is not None
        self.sink.hold_position_below(min(kept_back) if kept_back else None)
        results = self._deliver(send)
        cause = all_down(results)
        if cause is not None:
            raise DestinationDown(f"sink {name!r}: nothing acknowledged: {cause}")
        parked = self._park_failures(conn, send, results, held, stage_failed)
        delivered = sum(1 for r in results if r is None)
        self.store.advance_offset(conn, name, last, delivered, filtered, parked, last_ts)
        if self._waiting:
            self.store.set_waiting(conn, name, None)
            self._waiting = False
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
        self._live.saw(results)
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
            cause = f"{type(exc).__name__}: {_cause(exc)}"
            if batch.num_rows == 1:
                error = f"transform failed: {cause}"
            elif budget[0] < 0:  # park what is left rather than fail the run (and every run after it)
                error = NotIsolated(f"transform failed on this row or another of the {batch.num_rows} parked "
                                    f"with it (bisection budget spent): {cause}")
            else:
                mid = batch.num_rows // 2
                left, lf = self._stage_bisect(batch.slice(0, mid), schemas, budget)
                right, rf = self._stage_bisect(batch.slice(mid), schemas, budget)
                return pa.concat_tables([left.cast(right.schema), right]), lf + rf
            groups = self._groups(batch, schemas)
            return empty_output(), [(pos, groups[pos], error) for pos in groups]

    def _groups(self, batch: pa.Table, schemas: dict[str, list[dict[str, object]]]
                ) -> dict[Position, str | None]:
        """Each row's ordering group: its `group_columns` group where the table has one (via Spark, as
        the stage computes it), else table and key."""
        rows = [(int(r["commit_lsn"]), int(r["commit_idx"]), f"{r['table_schema']}|{r['table_name']}|{r['pk']}")
                for r in batch.select(["commit_lsn", "commit_idx", "table_schema", "table_name", "pk"]).to_pylist()]
        if not self.sink_config.message_grouping:
            return {(lsn, idx): None for lsn, idx, _ in rows}
        found: dict[Position, str | None] = {}
        if self.plan.group_columns:
            try:
                found = group_keys(self.spark, self.plan, batch, schemas)
            except Exception as exc:  # the record itself breaks Spark: table and key still order it
                log.warning("deliver: sink %s: cannot compute groups of failed rows: %s", self.sink_config.name,
                            _cause(exc))
        return {(lsn, idx): found.get((lsn, idx), default) for lsn, idx, default in rows}

    def _park_failures(self, conn: psycopg.Connection, sent: Sequence[OutboundMessage],
                       results: Sequence[str | None], held: Sequence[OutboundMessage],
                       stage_failed: Sequence[StageFailure] = ()) -> int:
        """Park what failed (a group's first failure with its error, the rest of the group as held) and
        what was held back; discard at once what fails with `max_retries: 0`."""
        failed_groups: set[str | None] = set()
        items: list[tuple[Position, str | None, str, int]] = []
        for pos, group, err in sorted(stage_failed):
            group = group if group is not None else f"~{pos[0]}:{pos[1]}"
            first = group not in failed_groups
            failed_groups.add(group)
            items.append((pos, group, err if first else HELD, 1 if first and not isinstance(err, NotIsolated) else 0))
        tried: list[Position] = []
        for m, err in zip(sent, results, strict=True):
            if err is None:
                continue
            pos = position_of(m)
            group = m.group if m.group is not None else f"~{m.key}"  # ungrouped: its own group
            first = group not in failed_groups
            failed_groups.add(group)
            # An unanswered message next to acknowledged ones is not yet known to be the culprit.
            counted = first and self._live.counts(pos, err)
            items.append((pos, group, err if first else HELD, 1 if counted else 0))
            if first:
                tried.append(pos)
        self._live.tried(tried)
        items += [(position_of(m), m.group, HELD, 0) for m in held]
        items.sort(key=lambda it: it[0])
        self.store.park(conn, self.sink_config.name, items, [self._delay(max(1, a)) for _, _, _, a in items])
        if self.sink_config.max_retries == 0:  # no retries: the first counted failure is final
            for pos, _, err, attempts in items:
                if attempts:
                    self.store.discard(conn, self.sink_config.name, pos, f"failed (max_retries: 0): {err}")
        return len(items)

    def _delay(self, attempt: int) -> int:
        b = self.sink_config.backoff
        return next_delay_ms(attempt, b.initial_ms, b.max_ms, b.multiplier, b.jitter)

    def _retry_due(self, conn: psycopg.Connection, stats: DeliveryStats) -> None:
        due = self.store.due_retries(conn, self.sink_config.name, min(self.batch_size, RETRY_CHUNK))
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
        assert self.sink is not None
        self.sink.hold_position_below(None)  # retries are behind the offset: recording them moves nothing
        sent = self._deliver(sendable)
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
            counted = self._live.counts(pos, err) and not isinstance(err, NotIsolated)
            tries = attempts[pos] + (1 if counted else 0)
            if limit is not None and tries > limit:
                self.store.discard(conn, name, pos, f"gave up after {tries - 1} retries: {err}")
                stats.discarded += 1
            else:
                self.store.park(conn, name, [(pos, group, err, tries)], [self._delay(max(1, tries))])
        self._live.tried(tried)
        self._live.forget(resolved)
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

