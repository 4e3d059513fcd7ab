"""Replays: re-deliver the retained changes of a commit-time window to one sink.

The window's log rows go through the sink's own stage (same filter, transform, route, stream shape)
to the sink, in commit order, so the sink receives the same messages with the same idempotency keys
as the first time. Only what the sink already had is replayed (up to its offset); its offset, parked
messages and every other sink are left alone, so the sink then simply continues where it was. The replay
holds the sink's send lock for its whole run, so live delivery of the sink pauses between two of its
sends and nothing of the two interleaves; a sink that holds rows (a mirror) is replayed from the window's
start up to its offset, so it never ends older than its offset says. A window
reaching back before what retention deleted is refused, naming the oldest replayable time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg

from cdc_pipeline.config import ConfigError, PipelineConfig, redact
from cdc_pipeline.config.base import qualify
from cdc_pipeline.core.lanes import Split, lane_name, parking_group, position_key
from cdc_pipeline.core.positions import START, Position
from cdc_pipeline.delivery.engine import Deliverer, send_lock
from cdc_pipeline.delivery.parking import messages_from
from cdc_pipeline.delivery.plan import SinkPlan
from cdc_pipeline.delivery.schedule.order import position_of
from cdc_pipeline.postgres import session
from cdc_pipeline.sinks.base import Sink
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline.state.lanes import SinkLanes
from cdc_pipeline.state.replay_log import load_window, oldest_retained, trimmed_until

log = logging.getLogger(__name__)

LOCK_WAIT_SECONDS = 5.0  # how often a replay waiting for the sink's send lock says so


class ReplayRefused(RuntimeError):
    """The window cannot be replayed (it reaches before the retained log)."""


@dataclass
class ReplayStats:
    sink: str
    start: datetime
    end: datetime | None
    read: int = 0
    delivered: int = 0
    filtered: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    after_window: int = 0  # a mirror's: read after the window, up to the offset

    def as_metadata(self) -> dict[str, Any]:
        return {"sink": self.sink, "from": self.start.isoformat(), "to": self.end.isoformat() if self.end else None,
                "messages_read": self.read, "messages_delivered": self.delivered,
                "messages_filtered": self.filtered, "messages_failed": self.failed,
                "messages_after_window": self.after_window, "first_errors": self.errors[:5],
                "seconds": round(self.seconds, 2)}


def parse_time(value: str) -> datetime:
    """ISO 8601 ('2026-11-23T14:05:00Z', '2026-11-23 14:05'); without a zone it is UTC."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ConfigError(f"{value!r} is not a time like 2026-11-23T14:05:00Z") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def replay(config: PipelineConfig, sink_name: str, start: datetime, end: datetime | None = None,
           table: str | None = None, spark: Any = None, sink: Sink | None = None) -> ReplayStats:
    sink_config = config.sink(sink_name)
    tables = list(sink_config.tables)
    if table is not None:
        qualified = qualify(table)
        if qualified not in tables:
            raise ConfigError(f"sink {sink_name!r} does not receive table {qualified!r} (it has {', '.join(tables)})")
        tables = [qualified]
    if end is not None and end <= start:
        raise ConfigError(f"replay window: --to ({end.isoformat()}) must be after --from ({start.isoformat()})")
    if spark is None and SinkPlan.build(config, sink_config).needs_record:
        from cdc_pipeline.delivery.spark_stage import spark_session

        spark = spark_session(config.spark)
    deliverer = Deliverer(config, sink_config, spark, sink=sink)
    change_log = deliverer.change_log
    stats = ReplayStats(sink_name, start, end)
    started = time.monotonic()
    with session.connect(config.state_dsn) as conn:
        trimmed = trimmed_until(conn, change_log)
        if trimmed is not None and start <= trimmed:
            oldest = oldest_retained(conn, change_log) or trimmed
            raise ReplayRefused(
                f"sink {sink_name!r}: cannot replay from {start.isoformat()}: retention deleted the log up to "
                f"{trimmed.isoformat()}; the oldest replayable time is {oldest.isoformat()}")
        conn.commit()
        target = deliverer.sink
        deliverer.context.state = conn  # http_pull queues in its transaction; source tables described on it
        target.open()
        try:
            # Live delivery of the sink sends nothing until the replay is done (delivery/turn.py), so
            # the offsets read now stay put and no live send lands between the replay's. A sink with lanes
            # (core/lanes.py) is replayed lane by lane, each up to its own offset.
            split, generation, _ = SinkLanes(config.state.schema_name).split(conn, sink_name)
            conn.commit()
            lanes = split.lanes
            for lane in range(lanes):
                while not session.wait_lock(conn, send_lock(lane_name(sink_name, lane, lanes)), LOCK_WAIT_SECONDS):
                    log.info("replay of sink %s: waiting for its delivery's current send", sink_name)
            # A mirror holds one version per row: replaying the window alone would leave the rows changed
            # after it older than the offset, so it is replayed from the window's start up to the offset.
            through = end if not target.holds_rows else None
            for lane in range(lanes):
                key = deliverer.context.position_key = position_key(sink_name, lane, lanes, generation)
                own = target.own_position.read(key) if target.own_position else None
                upto = max(deliverer.sink_offsets.sink_offset(conn, sink_name, lane), own or START)
                conn.commit()
                log.info("replaying %s changes committed in [%s, %s) to sink %s (up to its offset %s:%s)",
                         ",".join(tables), start, through or "now", lane_name(sink_name, lane, lanes), *upto)
                _replay_lane(deliverer, conn, change_log, tables, start, through, end, upto, lane, split, stats)
        finally:
            target.close()
    stats.seconds = time.monotonic() - started
    return stats


def _replay_lane(deliverer: Deliverer, conn: psycopg.Connection, change_log: ChangeLog, tables: list[str],
                 start: datetime, through: datetime | None, end: datetime | None, upto: Position, lane: int,
                 split: Split, stats: ReplayStats) -> None:
    after: Position = START
    sink_name = deliverer.sink_config.name
    while True:
        batch = load_window(conn, change_log, tables, sink_name, start, through, after, upto, deliverer.batch_size)
        schemas = deliverer.stager.schemas(conn) if batch.num_rows else {}
        conn.commit()
        if batch.num_rows == 0:
            return
        after = (batch.column("commit_lsn")[-1].as_py(), batch.column("commit_idx")[-1].as_py())
        out, stage_failed = deliverer.stager.stage(batch, schemas)
        messages = messages_from(out)
        filtered = batch.num_rows - len(messages) - len(stage_failed)
        if split.lanes > 1:
            messages = [m for m in messages if split.lane_of(parking_group(m.group, position_of(m))) == lane]
            stage_failed = [f for f in stage_failed if split.lane_of(parking_group(f[1], f[0])) == lane]
        results = deliverer.send(messages)
        conn.commit()  # http_pull: the queued messages
        if lane == 0:  # every lane reads the window: lane 0 counts what it holds
            stats.read += batch.num_rows
            stats.filtered += filtered
            if end is not None and through is None:
                stats.after_window += sum(1 for t in batch.column("commit_ts").to_pylist() if t >= end)
        stats.delivered += sum(1 for r in results if r is None)
        failures = [r for r in results if r is not None] + [err for _, _, err in stage_failed]
        stats.failed += len(failures)
        # Masked as parked errors are: they reach CLI output, Dagster logs, step errors and metadata.
        stats.errors += [redact(e) for e in failures[:max(0, 5 - len(stats.errors))]]
