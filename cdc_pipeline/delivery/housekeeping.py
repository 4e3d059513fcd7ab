"""What a delivery does between windows of calls, never while calls are out: the send lock let go (a replay's
turn), the run's time limit, the backlog rule (state.max_backlog_hours), a change of the sink's lanes noticed,
the parked messages due retried, and the window told which groups are parked. The backlog rule is applied at a
session's start too: a row stream too far behind restarts from a resync backfill, a change stream stops."""

from __future__ import annotations

import threading
import time

import psycopg

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery import backlog
from cdc_pipeline.delivery.lane_keeper import LaneKeeper
from cdc_pipeline.delivery.parking import ParkingLot
from cdc_pipeline.delivery.run_pass import Pass
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline.state.sink_offsets import SinkOffsets


class Housekeeping:
    waits_out_outages = True  # a long-running delivery rides through outages (outage.py ride_through)

    def __init__(self, config: PipelineConfig, sink_config: SinkConfig, change_log: ChangeLog, offsets: SinkOffsets,
                 lane: LaneKeeper, parking: ParkingLot) -> None:
        self.config = config
        self.sink_config = sink_config
        self.change_log, self.offsets = change_log, offsets  # the backlog rule's (backlog.py)
        self.lane = lane
        self.parking = parking
        self.resyncs: list[threading.Thread] = []  # backfills re-syncing a row stream (backlog.py)
        self._backlog_due = 0.0

    def start(self, conn: psycopg.Connection, offset: Position) -> Position:
        """A session's start: the backlog rule (a row stream resynced, a change stream stopped). The offset."""
        self._backlog_due = time.monotonic() + backlog.CHECK_SECONDS
        offset, resync = backlog.enforce(self.config, self.sink_config, self.change_log, self.offsets, conn, offset)
        if self.config.state.max_backlog_hours is not None:
            self.resyncs = backlog.start_resync(self.config, self.sink_config, backlog.resync_tables(
                self.config, self.sink_config, conn, resync))
        return offset

    def resyncing(self) -> bool:
        return any(t.is_alive() for t in self.resyncs)

    def between_windows(self, run: Pass) -> bool:
        """The window is empty: what may not happen while calls are out. False: stop."""
        run.turn.give()
        if run.over_time():
            return False
        if self.config.state.max_backlog_hours is not None and time.monotonic() >= self._backlog_due:
            self._enforce_backlog(run)  # a long run can fall behind too, not only a starting one
        if self.lane.superseded(run.conn):  # another process changes the sink's lanes
            return False
        with run.turn.around() as got:
            if got:
                self.parking.retry_due(run.conn, run.stats)
        if not got:
            return False
        run.window.reset(self.parking.parked_groups(run.conn) if self.sink_config.message_grouping else set())
        run.conn.commit()
        return True

    def _enforce_backlog(self, run: Pass) -> None:
        """state.max_backlog_hours during a run: a row stream too far behind restarts from a resync."""
        self._backlog_due = time.monotonic() + backlog.CHECK_SECONDS
        new_offset, resync = backlog.enforce(self.config, self.sink_config, self.change_log, self.offsets, run.conn,
                                              run.offset)
        run.conn.commit()
        if resync:
            run.blocks.restart(new_offset)
            run.calls.clear()
            run.offset = new_offset
            self.resyncs += backlog.start_resync(self.config, self.sink_config, list(self.sink_config.tables))
