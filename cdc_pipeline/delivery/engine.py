"""Delivery of one sink: log -> Spark stage -> sink, with parking, retries and per-group order.

The Deliverer is wired here from explicit parts, each given what it needs: a reader of the log (reader.py:
blocks staged ahead, typed runs relayed), a stager (staging.py), a parking lot (parking.py), the scheduler
(schedule/: calls cut from a block, the hold-back policy, the window of calls, the settler) and the offset
keeper that settles every send (offset.py).

Each block: read after the last one and through the stage, cut into the sink's calls of at most its
`batch_size` log rows; each call holds back messages whose group has a parked or failed message, hands the
rest to the sink in the calls its ordering needs, parks what failed (and what is behind it in its group);
settled in order, the offset advances past each call. Up to the sink's `max_in_flight` calls (its `limits()`)
are out at once, across blocks, a group's message never before the outcome of its earlier one. So a poison
message never stalls the other groups, and a group never delivers a message before an earlier one of its own.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

import psycopg

from cdc_pipeline.backfill.typed import takes_typed
from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.delivery import backlog
from cdc_pipeline.delivery.enrichment import Enricher
from cdc_pipeline.delivery.lane_keeper import LaneKeeper, LockStillHeld, SinkBusy, send_lock
from cdc_pipeline.delivery.lazy_spark import LazySpark
from cdc_pipeline.delivery.offset import OffsetKeeper
from cdc_pipeline.delivery.outage import Liveness, ride_through
from cdc_pipeline.delivery.parking import RETRY_CHUNK, ParkingLot
from cdc_pipeline.delivery.plan import SinkPlan
from cdc_pipeline.delivery.reader import Blocks, Reader, Staged
from cdc_pipeline.delivery.relay import Relay
from cdc_pipeline.delivery.schedule.calls import Call
from cdc_pipeline.delivery.schedule.dispatch import Dispatch
from cdc_pipeline.delivery.schedule.limits import resolve as resolve_limits
from cdc_pipeline.delivery.schedule.settle import Settler
from cdc_pipeline.delivery.schedule.window import CallWindow
from cdc_pipeline.delivery.staging import Stager
from cdc_pipeline.delivery.stats import DeliveryStats
from cdc_pipeline.delivery.turn import SendTurn
from cdc_pipeline.postgres import session
from cdc_pipeline.postgres.catalog import TableInfo
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import OutboundMessage, Sink
from cdc_pipeline.state import notify
from cdc_pipeline.state.base import StateError
from cdc_pipeline.state.store import Position, Store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Deliverer", "DeliveryStats", "SinkBusy", "send_lock"]

log = logging.getLogger(__name__)

# A window of several calls is let drain this often, so parked retries, a replay's turn, a change of lanes
# and the run's time limit get in between sends (a window of one call drains after every call).
HOUSEKEEPING_SECONDS = 1.0
SETTLE_SECONDS = 0.2  # a wider window settles the calls done at its head this often (one state commit: a WAL flush)


SEND, AGAIN, STOP = object(), object(), object()  # what a step of the loop says: send a call, loop again, stop


@dataclass
class _Pass:
    """The loop's state over one session (Deliverer._loop and its steps)."""

    conn: psycopg.Connection  # the state connection: offsets, parking, the send lock
    blocks: Blocks  # the log read ahead (reader.py)
    turn: SendTurn  # the send lock, held while calls are out (turn.py)
    watch: notify.LogWatch | notify.Sleep  # woken when the drain commits new rows
    window: CallWindow
    stats: DeliveryStats
    started: float
    until_idle: bool
    seconds: float | None
    offset: Position  # settled
    backlog_due: float
    calls: deque[Call] = field(default_factory=deque)  # cut from the loaded block, not handed to the window yet
    idle: bool = False
    settle_due: float = 0.0  # a wider window settles what is done this often

    def settle(self, settler: Settler, block: bool) -> None:
        self.offset = settler.settle(self.conn, self.stats, self.window, self.window.settled(block=block), self.offset)


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
        # What the sink takes at once, and the log rows of a call settled on its own (schedule/limits.py).
        self.limits, self.batch_size = resolve_limits(config, sink_config, self.sink)
        self.enricher = (Enricher(config.source.dsn, sink_config.enrichment, self._key_columns)
                         if sink_config.enrichment else None)  # enrichment.py
        self._stop = threading.Event()
        self.dispatch = Dispatch(self.sink, self.limits, self._stop) if self.sink is not None else None  # schedule/
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
        relay = Relay(sink_config, lane, self.store, self.sink, self._live, self.offsets) if self.sink else None
        # A sink that writes files (a lake table) gathers a trickle of changes: once a block reached the log's
        # end, the next is read this long after it (sinks/base.py `gather_seconds`); a backlog goes at once.
        gather = type(self.sink).gather_seconds(sink_config) if self.sink is not None else 0.0
        # Typed reads go to the sink as typed rows only on the Arrow path of a sink that writes them as they
        # are; everything else loads them as JSON (backfill/typed.py).
        typed_rows = (self.sink is not None and sink_config.enrichment is None
                      and takes_typed(config, sink_config, type(self.sink)))
        self.reader = Reader(config, sink_config, self.store, self.stager, self.lane, relay, self.batch_size,
                             typed_rows, gather, self._stop)  # reader.py
        self.settler = Settler(sink_config.name, self.parking, self.offsets, self._live)  # schedule/settle.py

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
        cfg = self.config.delivery
        ride_through(lambda first: self._session(stats, started, until_idle, seconds, first), stats, self.lane.name,
                     (cfg.retry_initial_ms, cfg.retry_max_ms), self._stop,
                     deadline=started + seconds if seconds is not None else None, one_off=until_idle or self.dry_run,
                     record=self.offsets.record_waiting, also=(LockStillHeld,))
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
        """Micro-batches until idle (or stopped). The next block is loaded and staged on a second connection
        while the sink gets the current one's calls (schedule/calls.py), up to the sink's `max_in_flight` at once
        across blocks (schedule/window.py); settled in order, the offset following the settled prefix. Each turn:
        the housekeeping between windows (_between_windows), a block read when no call waits (_read), a call
        sent (_send)."""
        window = CallWindow(self.send, self.limits.max_in_flight, 2 * self.reader.load_size)
        with session.connect(self.config.state_dsn) as loader, ThreadPoolExecutor(1) as pool, \
                notify.watching(self.config.state_dsn, self.config.state.schema_name, self._stop, not until_idle,
                                f"cdc-pipeline deliver {self.lane.name} (listen)") as watch:
            turn = SendTurn(conn, self.lane.send_lock, self.lane.name, self._stop, locking=not self.dry_run)
            run = _Pass(conn, Blocks(self.reader, loader, pool, offset), turn, watch, window, stats, started,
                        until_idle, seconds, offset, backlog_due=time.monotonic() + backlog.CHECK_SECONDS)
            try:
                while not self._stop.is_set():
                    if not len(window) and not self._between_windows(run):
                        break
                    step = self._read(run) if not run.calls else SEND
                    if step is SEND:
                        step = self._send(run)
                    if step is STOP:
                        break
                while len(window):
                    run.settle(self.settler, block=True)
            except BaseException:
                window.abandon()  # nothing goes out behind an error, and nothing is settled past it
                raise
            finally:
                window.close()
                run.blocks.close()
                with suppress(psycopg.Error):  # an error on the way here is the one to report
                    run.turn.give()
        return run.offset

    def _between_windows(self, run: _Pass) -> bool:
        """What may not happen while calls are out: the send lock let go (a replay's turn), the run's time
        limit, the backlog rule, a change of lanes, the parked messages due; False: stop."""
        run.turn.give()
        if run.seconds is not None and time.monotonic() - run.started >= run.seconds:
            return False
        if self.config.state.max_backlog_hours is not None and time.monotonic() >= run.backlog_due \
                and not self.dry_run:  # a long run can fall behind too, not only a starting one
            self._enforce_backlog(run)
        if self.dry_run:
            return True
        if self.lane.superseded(run.conn):  # another process changes the sink's lanes
            return False
        with run.turn.around() as got:
            if got:
                self.parking.retry_due(run.conn, run.stats)
        if not got:
            return False
        run.window.reset(self.store.parked_groups(run.conn, self.sink_config.name, self.lane.lane)
                         if self.sink_config.message_grouping else set())
        run.conn.commit()
        return True

    def _enforce_backlog(self, run: _Pass) -> None:
        """state.max_backlog_hours during a run: a row stream too far behind restarts from a resync."""
        run.backlog_due = time.monotonic() + backlog.CHECK_SECONDS
        new_offset, resync = backlog.enforce(self.config, self.sink_config, self.store, run.conn, run.offset)
        run.conn.commit()
        if resync:
            run.blocks.restart(new_offset)
            run.calls.clear()
            run.offset = new_offset
            self._resyncs += backlog.start_resync(self.config, self.sink_config, list(self.sink_config.tables))

    def _read(self, run: _Pass) -> object:
        """The next block (reader.py) cut into calls. SEND: calls wait; AGAIN: nothing to send yet; STOP."""
        staged, prefetched = run.blocks.next(run.until_idle, time.monotonic() - run.started, run.seconds)
        if staged.rows == 0 and staged.run is None:  # a lane's block may hold none of its rows, yet move on
            return self._idle(run, prefetched)
        run.idle = False
        if staged.run is not None:  # relayed from the loader's connection: nothing loads meanwhile
            relayed = self._relay_run(run, staged)
            if not isinstance(relayed, Staged):
                return relayed
            staged = relayed
        run.calls.extend(self.reader.calls(staged))
        if self.dry_run:
            run.offset = self._dry_run(run.calls, run.stats) or run.offset
            return AGAIN
        return SEND

    def _idle(self, run: _Pass, prefetched: bool) -> object:
        """An empty block: settle what is out, look again, or wait for changes (STOP: a one-off run is done)."""
        if len(run.window):  # settle what is out before looking again
            run.settle(self.settler, block=True)
            return AGAIN
        if prefetched:  # looked for while the last block was sent: look again before waiting
            return AGAIN
        resyncing = any(t.is_alive() for t in self._resyncs)
        if run.until_idle and not resyncing:
            return STOP
        if not run.idle:  # once per idle spell: what a long-running delivery is waiting for
            log.info("sink %s: caught up at %s:%s, waiting for new changes in the log%s", self.lane.name,
                     *run.offset, " and its resync backfill" if resyncing else "")
        run.idle = True
        run.watch.wait(self.config.delivery.idle_seconds)  # woken by the drain's commit
        return AGAIN

    def _relay_run(self, run: _Pass, staged: Staged) -> Staged | object:
        """A typed run relayed once the window is settled, under the send lock: AGAIN when done, STOP, or the run
        loaded message by message (a fallback) to send as calls."""
        while len(run.window):
            run.settle(self.settler, block=True)
        with run.turn.around() as got:
            if got:
                run.offset, fallback = run.blocks.relayed(run.conn, staged, run.stats)
        if not got:
            return STOP
        return AGAIN if fallback is None else fallback

    def _send(self, run: _Pass) -> object:
        """The next call out once the window has room (settling its head meanwhile), under the send lock;
        what is done settled every SETTLE_SECONDS, and the whole window every HOUSEKEEPING_SECONDS."""
        window = run.window
        if not window.room(run.calls[0]):
            run.offset = self.settler.settle(run.conn, run.stats, window, window.make_room(run.calls[0]), run.offset)
            return AGAIN
        if not run.turn.take():
            return STOP
        window.submit(run.calls.popleft())
        if window.width == 1 or time.monotonic() >= run.settle_due:  # a state commit per call would be the limit
            run.settle(self.settler, block=False)
            run.settle_due = time.monotonic() + SETTLE_SECONDS
        if len(window) and time.monotonic() - window.opened >= HOUSEKEEPING_SECONDS:
            while len(window):  # let retries, a replay's turn and a change of lanes in
                run.settle(self.settler, block=True)
        return AGAIN

    def _dry_run(self, calls: deque[Call], stats: DeliveryStats) -> Position | None:
        """Print the calls' messages instead of sending them; nothing is settled. The last position printed."""
        last = None
        while calls:
            call = calls.popleft()
            for m in call.messages:
                self.dry_run_out.write(m.payload.decode() + "\n")
            stats.batches += 1
            stats.read += call.read
            stats.filtered += call.filtered
            stats.delivered += len(call.messages)
            last = call.last
        return last

    def send(self, messages: Sequence[OutboundMessage], kept_back: Position | None = None) -> list[str | None]:
        """Per message: None (delivered), its error, or held behind its group's failure (schedule/order.py). Called
        from the window's threads too: the destination's liveness is noted as the results come."""
        if not messages:
            return []
        assert self.dispatch is not None
        results = self.dispatch(messages, kept_back)
        self._live.saw(results)
        return results

    def _key_columns(self, table: str) -> tuple[str, ...]:
        if table not in self._keys:
            with session.connect(self.config.state_dsn) as conn:
                info = self.store.table_info(conn, table)
            self._keys[table] = info.primary_key if info else ()
        return self._keys[table]
