"""A dry run: the Deliverer wired with a sink that prints what it would send (one JSON line per message) and a
state side that records nothing: no lane joined nor lock taken, no offset moved, nothing parked or retried, no
backlog rule, no wait recorded. It shows what is waiting now, so it waits out no outage."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime
from typing import IO

import psycopg

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.engine import Deliverer
from cdc_pipeline.delivery.housekeeping import Housekeeping
from cdc_pipeline.delivery.lane_keeper import LaneKeeper
from cdc_pipeline.delivery.lazy_spark import LazySpark
from cdc_pipeline.delivery.offset import OffsetKeeper
from cdc_pipeline.delivery.parking import ParkingLot
from cdc_pipeline.delivery.parts import Parts
from cdc_pipeline.delivery.run_pass import Pass
from cdc_pipeline.delivery.staging import StageFailure
from cdc_pipeline.delivery.stats import DeliveryStats
from cdc_pipeline.sinks.base import OutboundMessage, Sink


class PrintingSink(Sink):
    """Writes each message's JSON to ``out`` (left open: it is the caller's)."""

    def __init__(self, name: str, out: IO[str]) -> None:
        self.name = name
        self.out = out

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        for m in batch:
            self.out.write(m.payload.decode() + "\n")
        return [None] * len(batch)


class _Figures(OffsetKeeper):
    """The run's figures only: the offset stays where it is."""

    def settle(self, conn: psycopg.Connection, stats: DeliveryStats, last: Position, delivered: int,
               filtered: int, parked: int, last_ts: datetime | None, read: int = 0) -> Position:
        stats.delivered += delivered
        return last

    def record_waiting(self, reason: str | None) -> None:
        pass


class _NoParking(ParkingLot):
    """A stage failure is not printed and not parked (the sink itself fails nothing)."""

    def park_failures(self, conn: psycopg.Connection, sent: Sequence[OutboundMessage], results: Sequence[str | None],
                      held: Sequence[OutboundMessage], stage_failed: Sequence[StageFailure] = ()) -> int:
        return 0


class _Unlocked(LaneKeeper):
    """Every message of the lane, no lock, no split joined or changed."""

    locks = False

    def join(self, conn: psycopg.Connection, sink: Sink, first: bool) -> None:
        pass

    def superseded(self, conn: psycopg.Connection) -> bool:
        return False


class _TimeLimitOnly(Housekeeping):
    waits_out_outages = False

    def start(self, conn: psycopg.Connection, offset: Position) -> Position:
        return offset

    def between_windows(self, run: Pass) -> bool:
        return not run.over_time()


class DryRun(Deliverer):
    def __init__(self, config: PipelineConfig, sink_config: SinkConfig, spark: LazySpark | object,
                 out: IO[str] | None = None, lane: int = 0) -> None:
        super().__init__(config, sink_config, spark, PrintingSink(sink_config.name, out or sys.stdout), lane,
                         Parts(_Figures, _NoParking, _Unlocked, _TimeLimitOnly))
