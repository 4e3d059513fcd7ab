"""Delivery of one sink: log -> Spark stage -> sink, with parking, retries and per-group order.

The Deliverer wires parts, each given what it needs: the log read (reader.py, feed.py), the stage (staging.py),
the parking lot (parking.py), the scheduler (schedule/), the offset (offset.py), the lane (lane_keeper.py) and the
housekeeping between windows (housekeeping.py); its loop sends the calls. Up to the sink's `max_in_flight`
calls are out at once, a group's message never before the outcome of its earlier one; settled in order, the
offset follows. A dry run is the same wiring with a printing sink and a state side that records nothing
(dry_run.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from typing import TYPE_CHECKING

import psycopg

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.enrichment import Enricher
from cdc_pipeline.delivery.feed import Feed
from cdc_pipeline.delivery.lane_keeper import LockStillHeld, SinkBusy, send_lock
from cdc_pipeline.delivery.lazy_spark import LazySpark
from cdc_pipeline.delivery.outage import Liveness, ride_through
from cdc_pipeline.delivery.parking import RETRY_CHUNK
from cdc_pipeline.delivery.parts import RECORDING, Parts
from cdc_pipeline.delivery.plan import SinkPlan
from cdc_pipeline.delivery.reader import Blocks, Reader
from cdc_pipeline.delivery.relay import Relay
from cdc_pipeline.delivery.run_pass import AGAIN, SEND, STOP, Pass
from cdc_pipeline.delivery.schedule.dispatch import Dispatch
from cdc_pipeline.delivery.schedule.limits import resolve as resolve_limits
from cdc_pipeline.delivery.schedule.settle import Settler
from cdc_pipeline.delivery.schedule.window import CallWindow
from cdc_pipeline.delivery.source_tables import SourceTables
from cdc_pipeline.delivery.staging import Stager
from cdc_pipeline.delivery.stats import DeliveryStats
from cdc_pipeline.delivery.turn import SendTurn
from cdc_pipeline.postgres import session
from cdc_pipeline.sinks import build_sink, takes_typed
from cdc_pipeline.sinks.base import OutboundMessage, Sink, SinkContext
from cdc_pipeline.state import notify
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline.state.failed_messages import FailedMessages
from cdc_pipeline.state.sink_offsets import SinkOffsets

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Deliverer", "DeliveryStats", "SinkBusy", "send_lock"]

# A window of several calls is let drain this often, so parked retries, a replay's turn, a change of lanes
# and the run's time limit get in between sends (a window of one call drains after every call).
HOUSEKEEPING_SECONDS = 1.0
SETTLE_SECONDS = 0.2  # a wider window settles the calls done at its head this often (one state commit: a WAL flush)


class Deliverer:
    def __init__(self, config: PipelineConfig, sink_config: SinkConfig, spark: SparkSession | LazySpark,
                 sink: Sink | None = None, lane: int = 0, parts: Parts = RECORDING) -> None:
        self.config, self.sink_config, self.spark = config, sink_config, spark
        # The state tables, each handed to the parts that use it: the log, the offsets, the parked messages.
        schema = config.state.schema_name
        self.change_log, self.sink_offsets, self.failed = ChangeLog(schema), SinkOffsets(schema), FailedMessages(schema)
        self.tables = tables = SourceTables(schema, config.state_dsn)
        # What the sink gets from its delivery (sinks/base.py); its session's state connection is set per session.
        self.context = SinkContext(sink_config.name, config.state.schema_name, config.state_dsn, spark,
                                   describe=lambda table: tables.describe(self.context.state, table))
        if sink is not None:  # built elsewhere (Dagster's sinks resource, a test): handed the context now
            sink.context = self.context
        self.sink = sink or build_sink(sink_config, context=self.context)
        self.limits, self.batch_size = resolve_limits(config, sink_config, self.sink)  # at once; rows a call
        self.enricher = (Enricher(config.source.dsn, sink_config.enrichment, tables.primary_key)
                         if sink_config.enrichment else None)  # enrichment.py
        self._stop = threading.Event()
        self.dispatch = Dispatch(self.sink, self.limits, self._stop)  # schedule/dispatch.py
        self.lane = parts.lane(sink_config.name, lane, sink_config.lanes, self.sink_offsets, self._stop)  # lane_keeper.py
        self._live = Liveness()  # which failures are the destination's rather than a message's (outage.py)
        self.stats: DeliveryStats | None = None
        self.offsets = parts.offsets(self.sink_offsets, self.change_log, config.state_dsn, sink_config.name, lane)
        self.plan = SinkPlan.build(config, sink_config)
        self.stager = Stager(spark, self.plan, sink_config, tables, self.enricher)
        self.parking = parts.parking(sink_config, lane, self.failed, self.change_log, self._live, self.stager,
                                     self.send, min(self.batch_size, RETRY_CHUNK))
        self.housekeeping = parts.housekeeping(config, sink_config, self.change_log, self.sink_offsets, self.lane,
                                               self.parking)
        # Typed reads reach the sink as typed rows only on the Arrow path of a sink that writes them as they are.
        typed_rows = sink_config.enrichment is None and takes_typed(config, sink_config, type(self.sink))
        relay = Relay(sink_config, lane, self.failed, self.change_log, self.sink, self._live, self.offsets)
        self.reader = Reader(config, sink_config, self.change_log, self.stager, self.lane, relay, self.batch_size,
                             typed_rows, type(self.sink).gather_seconds(sink_config), self._stop)  # reader.py
        self.feed = Feed(self.reader, self.lane.name, config.delivery.idle_seconds, self.housekeeping.resyncing)
        self.settler = Settler(sink_config.name, self.parking, self.offsets, self._live)  # schedule/settle.py

    def stop(self) -> None:
        self._stop.set()

    def run(self, until_idle: bool = True, seconds: float | None = None) -> DeliveryStats:
        """Deliver until idle (``until_idle``), stopped or ``seconds`` have passed. A long-running delivery
        rides through its destination or the state database being down: it waits with capped backoff,
        logs and records (for `status`) what it waits for, and resumes from its committed offset. With
        ``until_idle`` such an outage ends the run with the error instead (a one-off catch-up)."""
        self.stats = stats = DeliveryStats(self.lane.name)  # read live by the metrics and /readyz (ops/)
        started = time.monotonic()
        cfg = self.config.delivery
        ride_through(lambda first: self._session(stats, started, until_idle, seconds, first), stats, self.lane.name,
                     (cfg.retry_initial_ms, cfg.retry_max_ms), self._stop,
                     deadline=started + seconds if seconds is not None else None,
                     one_off=until_idle or not self.housekeeping.waits_out_outages,
                     record=self.offsets.record_waiting, also=(LockStillHeld,))
        stats.seconds = time.monotonic() - started
        return stats

    def _session(self, stats: DeliveryStats, started: float, until_idle: bool, seconds: float | None,
                 first: bool) -> None:
        sink, name = self.sink, self.sink_config.name
        with session.connect(self.config.state_dsn, application_name=f"cdc-pipeline deliver {self.lane.name}") as conn:
            try:
                self.context.state = conn
                sink.open()  # before the lane is joined: a change of split reads the destination's positions
                self.lane.join(conn, sink, first)
                offset = self.offsets.start(conn, self.sink_config.tables, sink.own_position, self.context.position_key)
                stats.waiting = None  # both databases answer again (the recorded wait ends at the next send)
                offset = self.housekeeping.start(conn, offset)
                stats.offset = offset = self._loop(conn, offset, stats, started, until_idle, seconds)
                stats.lag_messages = self.change_log.count_after(conn, self.sink_config.tables, offset, sink=name)
                conn.commit()
                stats.waiting = None
            finally:
                sink.close()
                if self.enricher is not None:
                    self.enricher.close()

    def _loop(self, conn: psycopg.Connection, offset: Position, stats: DeliveryStats, started: float,
              until_idle: bool, seconds: float | None) -> Position:
        """Micro-batches until idle (or stopped). The next block is loaded and staged on a second connection
        while the sink gets the current one's calls, up to the sink's `max_in_flight` at once across blocks
        (schedule/window.py); settled in order, the offset following the settled prefix. Each turn: the
        housekeeping between windows (housekeeping.py), a block read when no call waits (feed.py), a call sent."""
        window = CallWindow(self.send, self.limits.max_in_flight, 2 * self.reader.load_size)
        with session.connect(self.config.state_dsn) as loader, ThreadPoolExecutor(1) as pool, \
                notify.watching(self.config.state_dsn, self.config.state.schema_name, self._stop, not until_idle,
                                f"cdc-pipeline deliver {self.lane.name} (listen)") as watch:
            turn = SendTurn(conn, self.lane.send_lock, self.lane.name, self._stop, locking=self.lane.locks)
            run = Pass(conn, Blocks(self.reader, loader, pool, offset), turn, watch, window, self.settler, stats,
                       started, until_idle, seconds, offset)
            try:
                while not self._stop.is_set():
                    if not len(window) and not self.housekeeping.between_windows(run):
                        break
                    step = self.feed.read(run) if not run.calls else SEND
                    if step is SEND:
                        step = self._send(run)
                    if step is STOP:
                        break
                run.drain()
            except BaseException:
                window.abandon()  # nothing goes out behind an error, and nothing is settled past it
                raise
            finally:
                window.close()
                run.blocks.close()
                with suppress(psycopg.Error):  # an error on the way here is the one to report
                    run.turn.give()
        return run.offset

    def _send(self, run: Pass) -> object:
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
            run.settle(block=False)
            run.settle_due = time.monotonic() + SETTLE_SECONDS
        if len(window) and time.monotonic() - window.opened >= HOUSEKEEPING_SECONDS:
            run.drain()  # let retries, a replay's turn and a change of lanes in
        return AGAIN

    def send(self, messages: Sequence[OutboundMessage], kept_back: Position | None = None) -> list[str | None]:
        """Per message: None, its error or HELD (schedule/); from the window's threads too, liveness noted."""
        if not messages:
            return []
        results = self.dispatch(messages, kept_back)
        self._live.saw(results)
        return results
