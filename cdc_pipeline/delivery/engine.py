"""Delivery of one sink: log -> Spark stage -> sink, with parking, retries and per-group order.

The Deliverer is wired here from explicit parts, each given what it needs: a stager (staging.py), a parking
lot (parking.py), a relay of typed runs (relay.py) and the offset keeper that settles every send (offset.py).

Each micro-batch: load the log after the sink's offset, run the Spark stage, hold back messages whose
group already has a parked message, hand the rest to the sink in the calls its ordering needs
(dispatch.py, ordering.py), park what failed (and what is behind it in its group), then advance the
sink's offset past the whole batch. So a poison message never stalls
the other groups, and a group never delivers a message before an earlier one of its own.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

import psycopg
import pyarrow as pa

from cdc_pipeline.backfill.typed import takes_typed
from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.core.backoff import next_delay_ms
from cdc_pipeline.core.metrics_registry import BATCH_SECONDS
from cdc_pipeline.delivery import backlog
from cdc_pipeline.delivery.dispatch import deliver_in_order
from cdc_pipeline.delivery.enrichment import Enricher
from cdc_pipeline.delivery.lane_keeper import LaneKeeper, LockStillHeld, SinkBusy, send_lock
from cdc_pipeline.delivery.lazy_spark import LazySpark
from cdc_pipeline.delivery.offset import OffsetKeeper
from cdc_pipeline.delivery.ordering import position_of, split_held
from cdc_pipeline.delivery.outage import DestinationDown, Liveness, all_down, transient
from cdc_pipeline.delivery.parking import RETRY_CHUNK, ParkingLot, messages_from
from cdc_pipeline.delivery.plan import SinkPlan, empty_output
from cdc_pipeline.delivery.relay import Relay
from cdc_pipeline.delivery.staging import StageFailure, Stager
from cdc_pipeline.delivery.stats import DeliveryStats
from cdc_pipeline.postgres import session
from cdc_pipeline.postgres.catalog import TableInfo
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import OutboundMessage, Sink
from cdc_pipeline.state.base import StateError
from cdc_pipeline.state.store import LOG_ARROW_SCHEMA, Position, Store
from cdc_pipeline.state.typed_log import TypedRun
from cdc_pipeline.state.typed_rows import Columns, shapes_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Deliverer", "DeliveryStats", "SinkBusy", "send_lock"]

log = logging.getLogger(__name__)

TURN_WAIT_SECONDS = 1.0  # a send waiting for a replay looks at its stop event this often
# A session's first micro-batch is at most this many messages: sending starts as soon as they are staged,
# and the next (full) batch is loaded and staged meanwhile, instead of after a whole batch's load.
FIRST_BATCH = 1000


@dataclass(frozen=True)
class Staged:
    """One micro-batch read from the log and through the stage, ready to send."""

    batch: pa.Table
    last: Position  # the batch's last log position: the offset once it is sent
    out: pa.Table
    failed: list[StageFailure]
    shapes: dict[str, Columns] = field(default_factory=dict)  # typed reads' shapes, by backfill
    run: TypedRun | None = None  # a run of typed reads to relay (state/typed_log.py): batch is empty
    after: Position | None = None  # where the run starts


class Deliverer:
    def __init__(self, config: PipelineConfig, sink_config: SinkConfig, spark: SparkSession | LazySpark,
                 sink: Sink | None = None, dry_run: bool = False, dry_run_out: IO[str] | None = None,
                 lane: int = 0) -> None:
        self.config = config
        self.sink_config = sink_config
        self.spark = spark
        self.store = Store(config.state.schema_name)
        self.plan = SinkPlan.build(config, sink_config)
        self.dry_run = dry_run
        self.dry_run_out = dry_run_out or sys.stdout
        self.sink = None if dry_run else (sink or build_sink(sink_config))
        self.batch_size = sink_config.batch_size or config.delivery.batch_size
        # Typed reads go to the sink as typed rows only on the Arrow path of a sink that writes them as they
        # are; everything else loads them as JSON (backfill/typed.py).
        self.typed_rows = (self.sink is not None and sink_config.enrichment is None
                           and takes_typed(config, sink_config, type(self.sink)))
        self.enricher = (Enricher(config.source.dsn, sink_config.enrichment, self._key_columns)
                         if sink_config.enrichment else None)  # enrichment.py
        self._stop = threading.Event()
        self.lane = LaneKeeper(sink_config.name, lane, sink_config.lanes, self.store, self._stop)  # lane_keeper.py
        self._keys: dict[str, tuple[str, ...]] = {}  # row streams: primary key columns per table
        self._resyncs: list[threading.Thread] = []  # backfills re-syncing a row stream (backlog.py)
        self._live = Liveness()  # which failures are the destination's rather than a message's (outage.py)
        self.stats: DeliveryStats | None = None
        # The parts, each given what it needs.
        self.offsets = OffsetKeeper(self.store, config.state_dsn, sink_config.name, lane)
        self.stager = Stager(spark, self.plan, sink_config, self.store, self.enricher, self._key_columns)
        self.parking = ParkingLot(sink_config, lane, self.store, self._live, self.stager, self.send,
                                  min(self.batch_size, RETRY_CHUNK))
        self.relay = Relay(sink_config, lane, self.store, self.sink, self._live, self.offsets) if self.sink else None

    def stop(self) -> None:
        self._stop.set()

    def run(self, until_idle: bool = True, seconds: float | None = None) -> DeliveryStats:
        """Deliver until idle (``until_idle``), stopped or ``seconds`` have passed. A long-running delivery
        rides through its destination or the state database being down: it waits with capped backoff,
        logs and records (for `status`) what it waits for, and resumes from its committed offset. With
        ``until_idle`` such an outage ends the run with the error instead (a one-off catch-up)."""
        stats = DeliveryStats(self.lane.name)
        self.stats = stats  # read live by the metrics and /readyz (ops/)
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
                except Exception as caught:
                    # A state database error that came through the sink's code is the state database's.
                    exc = caught.__cause__ if isinstance(caught, StateError) and caught.__cause__ else caught
                    if until_idle or self.dry_run or not (transient(exc) or isinstance(exc, LockStillHeld)):
                        if exc is caught:
                            raise
                        raise exc from None
                    progressed = (stats.delivered, stats.parked, stats.retried) != before
                    attempt = 1 if progressed else attempt + 1
                    delay = next_delay_ms(attempt, cfg.retry_initial_ms, cfg.retry_max_ms) / 1000
                    cause = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
                    stats.outage_retries += 1
                    stats.waiting = cause
                    what = "the state database" if isinstance(exc, psycopg.Error) else "the destination"
                    log.warning("deliver: sink %s: waiting for %s: %s; retry %d in %.1f s", self.lane.name,
                                what, cause, attempt, delay)
                    self.offsets.record_waiting(cause)
                    if deadline is not None and time.monotonic() + delay >= deadline:
                        break  # a time-limited run ends waiting; the next one starts over
                    if self._stop.wait(delay):
                        break
        finally:
            if stats.outage_retries:
                self.offsets.record_waiting(None)
        stats.seconds = time.monotonic() - started
        return stats

    def _session(self, stats: DeliveryStats, started: float, until_idle: bool, seconds: float | None,
                 first: bool) -> None:
        name, lane = self.sink_config.name, self.lane.lane
        with session.connect(self.config.state_dsn, application_name=f"cdc-pipeline deliver {self.lane.name}") as conn:
            try:
                if self.sink is not None:
                    self.sink.open()  # before the lane is joined: a change of split reads the destination's positions
                if not self.dry_run:
                    self.lane.join(conn, self.sink, first)
                if self.sink is not None:
                    self.sink.prepare(lambda table: self._table_info(conn, table))
                    self.sink.bind_state(conn, self.config.state.schema_name)
                    self.sink.bind_spark(self.spark)  # parquet writes through our (lazily started) session
                offset = self.store.sink_offset(conn, name, lane)
                if self.sink is not None:
                    held = self.sink.position()
                    if held is not None and held > offset:  # the sink committed before we did: record it
                        done = self.store.count_after(conn, self.sink_config.tables, offset, sink=name, upto=held)
                        self.store.advance_offset(conn, name, held, done, 0, 0, None, lane)
                        offset = held
                conn.commit()
                stats.waiting = None  # both databases answer again (the recorded wait ends at the next send)
                if not self.dry_run:  # state.max_backlog_hours: resync a row stream, stop a change stream
                    offset, resync = backlog.enforce(self.config, self.sink_config, self.store, conn, offset)
                    if self.config.state.max_backlog_hours is not None:
                        self._resyncs = backlog.start_resync(self.config, self.sink_config, backlog.resync_tables(
                            self.config, self.sink_config, conn, resync))
                offset = self._loop(conn, offset, stats, started, until_idle, seconds)
                stats.offset = offset
                stats.lag_messages = self.store.count_after(conn, self.sink_config.tables, offset, sink=name)
                conn.commit()
                stats.waiting = None
            finally:
                if self.sink is not None:
                    self.sink.close()
                if self.enricher is not None:
                    self.enricher.close()

    def _table_info(self, conn: psycopg.Connection, table: str) -> TableInfo | None:
        """A source table's description, for the sink (its errors are the state database's)."""
        try:
            return self.store.table_info(conn, table)
        except psycopg.Error as exc:
            raise StateError(f"describing {table}: {type(exc).__name__}") from exc

    def _loop(self, conn: psycopg.Connection, offset: Position, stats: DeliveryStats, started: float,
              until_idle: bool, seconds: float | None) -> Position:
        """Micro-batches until idle (or stopped). The next batch is loaded and staged on a second
        connection while the sink writes the current one: the two mostly wait on different servers."""
        with session.connect(self.config.state_dsn) as loader, ThreadPoolExecutor(1) as pool:
            ahead: Future[Staged] | None = None
            idle = False
            first = True  # the session's first batch: a short one (FIRST_BATCH)
            backlog_due = time.monotonic() + backlog.CHECK_SECONDS
            while not self._stop.is_set():
                if seconds is not None and time.monotonic() - started >= seconds:
                    break
                if self.config.state.max_backlog_hours is not None and time.monotonic() >= backlog_due \
                        and not self.dry_run:  # a long run can fall behind too, not only a starting one
                    backlog_due = time.monotonic() + backlog.CHECK_SECONDS
                    new_offset, resync = backlog.enforce(self.config, self.sink_config, self.store, conn, offset)
                    conn.commit()
                    if resync:
                        if ahead is not None:
                            ahead.result()  # staged from the old offset: dropped
                            ahead = None
                        offset = new_offset
                        self._resyncs += backlog.start_resync(self.config, self.sink_config, list(self.sink_config.tables))
                if not self.dry_run:
                    if self.lane.superseded(conn):  # another process changes the sink's lanes
                        break
                    with self._turn(conn) as turn:
                        if turn:
                            self.parking.retry_due(conn, stats)
                    if not turn:
                        break
                prefetched = ahead is not None
                staged = ahead.result() if ahead is not None else self._load_and_stage(loader, offset, first=first)
                ahead, first = None, False
                if staged.batch.num_rows == 0 and staged.run is None:
                    if prefetched:  # looked for while the last batch was sent: look again before waiting
                        continue
                    if until_idle and not any(t.is_alive() for t in self._resyncs):
                        break
                    if not idle:  # once per idle spell: what a long-running delivery is waiting for
                        log.info("sink %s: caught up at %s:%s, waiting for new changes in the log%s",
                                 self.lane.name, *offset,
                                 " and its resync backfill" if any(t.is_alive() for t in self._resyncs) else "")
                    idle = True
                    self._stop.wait(self.config.delivery.idle_seconds)
                    continue
                idle = False
                if staged.run is not None:  # relayed from the loader's connection: nothing loads meanwhile
                    with self._turn(conn) as turn:
                        if turn:
                            offset = self._send(conn, staged, stats, source=loader)
                    if not turn:
                        break
                    continue
                ahead = pool.submit(self._load_and_stage, loader, staged.last)
                with self._turn(conn) as turn:
                    if turn:
                        offset = self._send(conn, staged, stats)
                if not turn:
                    break
            if ahead is not None:
                ahead.result()  # let the loader finish before its connection closes
        return offset

    @contextmanager
    def _turn(self, conn: psycopg.Connection) -> Iterator[bool]:
        """The sink's send lock around one send: a replay holds it for its whole run (delivery/replay.py), so
        its old versions never land between live ones. False: stopped while a replay held it."""
        if self.dry_run:
            yield True
            return
        name = self.lane.send_lock
        waited = False
        while not session.wait_lock(conn, name, TURN_WAIT_SECONDS):
            if self._stop.is_set():
                yield False
                return
            if not waited:
                log.info("sink %s: waiting for a replay of this sink to finish", self.lane.name)
                waited = True
        def release() -> None:
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                conn.rollback()
            session.unlock(conn, name)
            conn.commit()

        try:
            yield True
        except BaseException:
            with suppress(psycopg.Error):  # the send's own error is the one to report
                release()
            raise
        release()

    def _load_and_stage(self, conn: psycopg.Connection, offset: Position, limit: int | None = None,
                        first: bool = False) -> Staged:
        """The next micro-batch after ``offset``: for a sink that takes typed rows, the run at the head of its
        log (a typed run is only described here, and relayed when sent); else up to ``limit`` messages (the
        batch size, or FIRST_BATCH for a session's ``first``)."""
        size = limit or (min(self.batch_size, FIRST_BATCH) if first else self.batch_size)
        if limit is None and self.typed_rows and not self.lane.filters:  # a relayed run is not split in lanes
            run = self.store.head_run(conn, self.sink_config.tables, offset, size, self.sink_config.name)
            conn.commit()
            if run is None:
                return Staged(LOG_ARROW_SCHEMA.empty_table(), offset, empty_output(), [])
            if run.typed:
                return Staged(LOG_ARROW_SCHEMA.empty_table(), run.last, empty_output(), [], run=run, after=offset)
            size = run.count
        batch = self.store.load_batch(conn, self.sink_config.tables, offset, size,
                                      sink=self.sink_config.name, max_bytes=self.config.delivery.batch_bytes,
                                      typed=self.typed_rows)
        schemas = self.stager.schemas(conn) if batch.num_rows else {}
        shapes = shapes_of(conn, self.config.state.schema_name, batch) if self.typed_rows else {}
        conn.commit()
        if batch.num_rows == 0:
            return Staged(batch, offset, empty_output(), [])
        last: Position = (batch.column("commit_lsn")[-1].as_py(), batch.column("commit_idx")[-1].as_py())
        out, stage_failed = self.stager.stage(batch, schemas)
        return Staged(batch, last, out, stage_failed, shapes)

    def _send(self, conn: psycopg.Connection, staged: Staged, stats: DeliveryStats,
              source: psycopg.Connection | None = None) -> Position:
        """Deliver one micro-batch and advance the offset (``conn``); a typed run is read from ``source``."""
        if staged.run is not None:
            # The relay's COPY holds its connection until the sink has applied it.
            assert source is not None and self.relay is not None
            if self.relay.relay(conn, source, staged.run, staged.after or (0, -1), stats):
                return staged.last
            # Rejected, or a parked group: the run message by message, which finds the read at fault or
            # holds the group's reads behind the parked one (ordering.py).
            staged = self._load_and_stage(conn, staged.after or (0, -1), limit=staged.run.count)
            if staged.batch.num_rows == 0:  # retention trimmed it meanwhile
                return staged.last
        batch, last, out, stage_failed = staged.batch, staged.last, staged.out, staged.failed
        last_ts = batch.column("commit_ts")[-1].as_py()
        stats.batches += 1
        stats.read += batch.num_rows
        messages = messages_from(out, staged.shapes)
        filtered = batch.num_rows - len(messages) - len(stage_failed)
        if self.lane.filters:  # every lane reads every row: lane 0 counts those none sends
            messages, stage_failed = self.lane.mine(messages, stage_failed)
            filtered = filtered if self.lane.lane == 0 else 0
        stats.filtered += filtered
        if self.dry_run:
            for m in messages:
                self.dry_run_out.write(m.payload.decode() + "\n")
            stats.delivered += len(messages)
            return last
        name = self.sink_config.name
        blocked = self.store.parked_groups(conn, name, self.lane.lane) if self.sink_config.message_grouping else set()
        send, held = split_held(messages, blocked, [(pos, g) for pos, g, _ in stage_failed])
        # Those are parked only by the state commit below: the sink must not record a position past them.
        kept_back = [position_of(m) for m in held] + [pos for pos, _, _ in stage_failed]
        began = time.monotonic()
        results = self.send(send, min(kept_back) if kept_back else None)
        cause = all_down(results)
        if cause is not None:
            raise DestinationDown(f"sink {name!r}: nothing acknowledged: {cause}")
        parked = self.parking.park_failures(conn, send, results, held, stage_failed)
        delivered = sum(1 for r in results if r is None)
        self.offsets.settle(conn, stats, last, delivered, filtered, parked, last_ts)
        BATCH_SECONDS.labels(name).observe(time.monotonic() - began)
        return last

    def send(self, messages: Sequence[OutboundMessage], kept_back: Position | None = None) -> list[str | None]:
        """Per message: None (delivered), its error, or held behind its group's failure (ordering.py)."""
        if not messages:
            return []
        assert self.sink is not None
        results = deliver_in_order(self.sink, messages, kept_back)
        self._live.saw(results)
        return results

    def _key_columns(self, table: str) -> tuple[str, ...]:
        if table not in self._keys:
            with session.connect(self.config.state_dsn) as conn:
                info = self.store.table_info(conn, table)
            self._keys[table] = info.primary_key if info else ()
        return self._keys[table]
