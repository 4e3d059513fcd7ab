"""Relaying runs of typed reads to a sink that writes them as they are: the Deliverer's relay.

A run of typed reads at the head of the sink's log (state/typed_log.py) is streamed from the state
database's COPY into the sink's (its ``typed_runs``) and the offset advanced past it, with no message per
row. It is not relayed while one of the sink's groups has a parked message, and a run the sink rejects is
applied by no one: the caller then sends the run message by message, which holds or parks what it must
(schedule/order.py).
"""

from __future__ import annotations

import logging

import psycopg

from cdc_pipeline.config import SinkConfig
from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.offset import OffsetKeeper
from cdc_pipeline.delivery.outage import Liveness
from cdc_pipeline.delivery.stats import DeliveryStats
from cdc_pipeline.sinks.base import Sink
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline.state.failed_messages import FailedMessages
from cdc_pipeline.state.typed_log import TypedRun

log = logging.getLogger(__name__)


class Relay:
    def __init__(self, sink_config: SinkConfig, lane: int, failed: FailedMessages, change_log: ChangeLog, sink: Sink,
                 live: Liveness, offsets: OffsetKeeper) -> None:
        self.sink_config = sink_config
        self.lane = lane
        self.failed = failed  # a parked group stops a relay
        self.change_log = change_log
        self.sink = sink
        self.live = live
        self.offsets = offsets

    def relay(self, conn: psycopg.Connection, source: psycopg.Connection, run: TypedRun, after: Position,
               stats: DeliveryStats) -> bool:
        """A run of typed reads relayed from the log to a sink that takes it whole (no message per row), when
        none of the sink's groups is parked. False: nothing was delivered (rejected by the destination, or
        a parked group): the caller sends the run message by message."""
        name = self.sink_config.name
        if self.sink_config.message_grouping and self.failed.parked_groups(conn, name, self.lane):
            return False
        typed_runs = self.sink.typed_runs
        assert typed_runs is not None  # asked only of a sink that takes typed rows (reader.py)
        self.sink.context.ceiling = None  # nothing of the run is parked
        with self.change_log.relay_rows(source, self.sink_config.tables, after, run, name) as rows:
            error = typed_runs(run, rows)  # it asks for the rows in the form it writes (typed_log.RunRows)
        source.commit()
        if error is not None:
            log.info("sink %s: a run of %d typed reads was rejected (%s); delivering it message by message",
                     name, run.count, error[:200])
            return False
        self.live.saw([None])
        stats.batches += 1
        stats.read += run.count
        self.offsets.settle(conn, stats, run.last, run.count, 0, 0, run.last_commit_ts, run.count)
        return True
