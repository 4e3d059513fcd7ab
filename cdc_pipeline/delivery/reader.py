"""The log read for one sink's delivery: blocks of it after the offset, through the stage, and runs of typed
reads relayed to a sink that writes them as they are.

A session's first block is at most FIRST_BATCH log rows, and each next one twice the last, up to the load size:
sending starts as soon as the first is staged, and each block is loaded and staged on a second connection
while the one before it is sent (staging costs about a third of what sending a row costs a webhook at 50,000
msgs/s). A sink that gathers (a lake table) has its next block read `gather_seconds` after one that reached
the log's end. Each block is cut into the sink's calls (schedule/calls.py), this lane's messages only.

A lane of a split hashed in SQL (core/lanes.py) whose sink's groups the database can compute (table and key,
or none) reads only its own rows (state/change_log.py: load_lane_block), blocks scaled by the number of lanes
so each still holds about the load size of its own; a block whose last rows are other lanes' ends in a call
of no message that moves the offset past them.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime

import psycopg
import pyarrow as pa

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.lane_keeper import LaneKeeper
from cdc_pipeline.delivery.parking import messages_from
from cdc_pipeline.delivery.plan import empty_output
from cdc_pipeline.delivery.relay import Relay
from cdc_pipeline.delivery.schedule.calls import MIN_LOAD, Call, cut
from cdc_pipeline.delivery.staging import StageFailure, Stager
from cdc_pipeline.delivery.stats import DeliveryStats
from cdc_pipeline.state.change_log import LOG_ARROW_SCHEMA, ChangeLog, LaneShare
from cdc_pipeline.state.typed_log import TypedRun
from cdc_pipeline.state.typed_records import shapes_of
from cdc_pipeline.state.typed_rows import Columns

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
    covered: int | None = None  # log rows the block covered, all lanes' (None: the batch's rows)
    last_ts: datetime | None = None  # the commit time at ``last``, when the batch does not end there

    @property
    def rows(self) -> int:
        """Log rows the block covered: 0 when the log held nothing more."""
        return self.batch.num_rows if self.covered is None else self.covered


def gather_wait(gather: float, got: int, asked: int, until_idle: bool, elapsed: float, seconds: float | None) -> float:
    """How long the next block waits to be read, for a sink that gathers (`gather_seconds`): `gather` after a
    block of fewer log rows than asked (the log's end was reached), within the run's `seconds`; nothing for a
    one-off catch-up (`until_idle`) or after a full block (a backlog)."""
    if not gather or until_idle or got >= asked:
        return 0.0
    left = seconds - elapsed if seconds is not None else gather
    return max(0.0, min(gather, left))


class Reader:
    def __init__(self, config: PipelineConfig, sink_config: SinkConfig, change_log: ChangeLog, stager: Stager,
                 lane: LaneKeeper, relay: Relay | None, batch_size: int, typed_rows: bool, gather: float,
                 stop: threading.Event) -> None:
        self.config = config
        self.sink_config = sink_config
        self.change_log = change_log
        self.stager = stager
        self.lane = lane
        self.relay = relay
        self.batch_size = batch_size  # log rows per call to the sink
        self.load_size = max(batch_size, MIN_LOAD)  # log rows per read and stage (schedule/calls.py)
        self.typed_rows = typed_rows  # typed reads reach the sink as typed rows, and in relayed runs
        self.gather = gather
        self._stop = stop

    def load_and_stage(self, conn: psycopg.Connection, offset: Position, size: int, exact: bool = False,
                       wait: float = 0.0) -> Staged:
        """The next block after ``offset``: for a sink that takes typed rows, the run at the head of its log
        (a typed run is only described here, and relayed when sent; at most the sink's batch size); else up to
        ``size`` log rows (``exact``: those, whatever they hold); read ``wait`` seconds from now (or at a stop)."""
        if wait:
            self._stop.wait(wait)
        if not exact and self.typed_rows and not self.lane.filters:  # a relayed run is not split in lanes
            run = self.change_log.head_run(conn, self.sink_config.tables, offset, min(size, self.batch_size),
                                           self.sink_config.name)
            conn.commit()
            if run is None:
                return Staged(LOG_ARROW_SCHEMA.empty_table(), offset, empty_output(), [])
            if run.typed:
                return Staged(LOG_ARROW_SCHEMA.empty_table(), run.last, empty_output(), [], run=run, after=offset)
            size = run.count
        share = self.share()
        if share is not None and not exact:
            block = self.change_log.load_lane_block(conn, self.sink_config.tables, offset, size * share.lanes, share,
                                                    sink=self.sink_config.name, typed=self.typed_rows,
                                                    max_bytes=self.config.delivery.batch_bytes)
            batch, covered = block.batch, block.covered
        else:
            batch = self.change_log.load_batch(conn, self.sink_config.tables, offset, size,
                                               sink=self.sink_config.name, max_bytes=self.config.delivery.batch_bytes,
                                               typed=self.typed_rows)
            covered = None
        schemas = self.stager.schemas(conn) if batch.num_rows else {}
        shapes = shapes_of(conn, self.config.state.schema_name, batch) if self.typed_rows and batch.num_rows else {}
        conn.commit()
        if share is not None and not exact:
            if block.end is None:
                return Staged(batch, offset, empty_output(), [], covered=0)
            out, stage_failed = self.stager.stage(batch, schemas) if batch.num_rows else (empty_output(), [])
            return Staged(batch, block.end, out, stage_failed, shapes, covered=covered, last_ts=block.end_ts)
        if batch.num_rows == 0:
            return Staged(batch, offset, empty_output(), [])
        last: Position = (batch.column("commit_lsn")[-1].as_py(), batch.column("commit_idx")[-1].as_py())
        out, stage_failed = self.stager.stage(batch, schemas)
        return Staged(batch, last, out, stage_failed, shapes)

    def share(self) -> LaneShare | None:
        """This lane's share of the log when the database can select it: the split's hash is computed in SQL,
        and so is the sink's group (table and key, or none: not `group_columns` nor a Python transform, which
        may set its own)."""
        if not self.lane.hashed_in_sql:
            return None
        plan = self.stager.plan
        grouped = self.sink_config.message_grouping
        if grouped and (plan.group_columns or plan.python_transform is not None):
            return None
        return LaneShare(self.lane.lane, self.lane.lanes, grouped)

    def calls(self, staged: Staged) -> list[Call]:
        """A staged block cut into the sink's calls (schedule/calls.py), each holding this lane's messages only."""
        batch = staged.batch
        positions = list(zip(batch.column("commit_lsn").to_pylist(), batch.column("commit_idx").to_pylist(),
                             strict=True))
        stamps = batch.column("commit_ts")
        calls = cut(positions, lambda i: stamps[i].as_py(), messages_from(staged.out, staged.shapes),
                    staged.failed, self.batch_size)
        if staged.covered is not None:  # this lane's rows only (the database selected them)
            if self.lane.split.prior:
                for c in calls:
                    c.messages, c.stage_failed = self.lane.mine(c.messages, c.stage_failed, selected=True)
            if not positions or positions[-1] < staged.last:  # other lanes' rows end the block: moved past
                calls.append(Call(staged.last, staged.last_ts, 0, 0, [], []))
        elif self.lane.filters:  # every lane reads every row: lane 0 counts those none sends
            for c in calls:
                c.messages, c.stage_failed = self.lane.mine(c.messages, c.stage_failed)
                c.filtered = c.filtered if self.lane.lane == 0 else 0
        return calls

    def relay_run(self, conn: psycopg.Connection, source: psycopg.Connection, staged: Staged,
                  stats: DeliveryStats) -> tuple[Position, Staged | None]:
        """Relay a typed run read from ``source`` (its COPY holds that connection until the sink has applied
        it): (the offset, None) when done; else the run loaded message by message, to send as a batch."""
        assert staged.run is not None and self.relay is not None
        after = staged.after or (0, -1)
        if self.relay.relay(conn, source, staged.run, after, stats):
            return staged.last, None
        # Rejected, or a parked group: the run message by message, which finds the read at fault or holds
        # the group's reads behind the parked one (schedule/order.py).
        fallback = self.load_and_stage(conn, after, staged.run.count, exact=True)
        if fallback.batch.num_rows == 0:  # retention trimmed it meanwhile
            return fallback.last, None
        return after, fallback


class Blocks:
    """A session's blocks: the next one read on the loader's connection while the last is sent."""

    def __init__(self, reader: Reader, loader: psycopg.Connection, pool: ThreadPoolExecutor, offset: Position) -> None:
        self.reader = reader
        self.loader = loader  # reads and stages the next block meanwhile (and relays typed runs)
        self._pool = pool
        self.loaded = offset  # the end of the last block read
        self._size = min(FIRST_BATCH, reader.load_size)  # the next block's
        self._ahead: Future[Staged] | None = None

    def next(self, until_idle: bool, elapsed: float, seconds: float | None) -> tuple[Staged, bool]:
        """The next block, and whether it was read ahead; a block of rows starts the read of the one after it
        (a typed run does not: it is relayed from the loader's connection, `relayed`)."""
        prefetched = self._ahead is not None
        share = self.reader.share()  # a lane's block covers this many more log rows (Reader.load_and_stage)
        asked = self._size * (share.lanes if share is not None else 1)  # what it was read for (a prefetch too)
        staged = self._ahead.result() if self._ahead is not None else \
            self.reader.load_and_stage(self.loader, self.loaded, self._size)
        self._ahead = None
        self._size = min(2 * self._size, self.reader.load_size)
        if staged.rows and staged.run is None:
            self.loaded = staged.last
            wait = gather_wait(self.reader.gather, staged.rows, asked, until_idle, elapsed, seconds)
            self._ahead = self._pool.submit(self.reader.load_and_stage, self.loader, self.loaded, self._size,
                                            wait=wait)
        return staged, prefetched

    def relayed(self, conn: psycopg.Connection, staged: Staged, stats: DeliveryStats) -> tuple[Position, Staged | None]:
        """A typed run relayed (Reader.relay_run); the next block is read after it."""
        offset, fallback = self.reader.relay_run(conn, self.loader, staged, stats)
        self.loaded = staged.last
        return offset, fallback

    def restart(self, offset: Position) -> None:
        """Read from ``offset`` on (a resync): what was read ahead is dropped."""
        if self._ahead is not None:
            self._ahead.result()  # staged from the old offset: dropped
            self._ahead = None
        self.loaded = offset

    def close(self) -> None:
        """Let the read ahead finish before the loader's connection closes."""
        if self._ahead is not None:
            with suppress(Exception):
                self._ahead.result()
