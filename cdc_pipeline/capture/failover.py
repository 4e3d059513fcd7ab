"""A slot missing after a failover (PostgreSQL <= 16, or a slot that was not a failover slot).

Up to 16 a logical slot lives only on the primary: a promoted standby has none, and the changes between
the drain's last position and the promotion cannot be read any more. The drain tells this apart from a
dropped slot (the server it reaches is not the one it read before) and reports it as a gap: under
`drain.on_gap: backfill` it creates the slot again on the new primary and the gap check that follows
(the log's position is behind the new slot's) backfills the tables; under `stop` it exits saying so.
"""

from __future__ import annotations

import logging

import psycopg
from psycopg import pq

from cdc_pipeline.capture import faults, source_server
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import catalog, session, slots
from cdc_pipeline.postgres.replication import int_to_lsn
from cdc_pipeline.state import slot_progress

log = logging.getLogger(__name__)


def slot_missing(cfg: PipelineConfig, source: psycopg.Connection,
                 state: psycopg.Connection) -> tuple[int, str | None]:
    """Raise the fix for a missing slot, or re-create it after a failover under on_gap: backfill and return
    its position (the gap check takes over from there)."""
    before = source_server.stored_server(source_server.load(state, cfg.state.schema_name, cfg.source.slot))
    state.commit()
    now = source_server.identify(source)
    if not source_server.failover_between(before, now) or before is None:
        raise faults.DrainFatal(faults.slot_gone(cfg.source.slot))
    what = (f"replication slot {cfg.source.slot!r} is missing after a failover: the drain read it on "
            f"{before.describe()} and now reaches {now.describe()}, which has no such slot (a slot survives a "
            "promotion only as a failover slot, PostgreSQL 17+ with source.failover: true)")
    # LSNs of two timelines are the same history only up to where the new one branched off: a log past that
    # point holds changes the new primary never received (the old one stopped before replicating them), which
    # the log and its sinks keep, and new changes could come at positions they have passed. Refused before the
    # slot is made, so every restart says so again.
    recorded = slot_progress.load(state, cfg.state.schema_name, cfg.source.slot)
    state.commit()
    split = branch_point(cfg.source.dsn, now.timeline, before.timeline)
    if split is None:  # no history to read: the new primary's WAL position is the bound
        row = source.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint").fetchone()
        split = int(row[0]) if row else 0
    if recorded is not None and recorded > split:
        raise faults.DrainFatal(
            f"{what}, and the change log holds changes up to LSN {int_to_lsn(recorded)}, past the point where the "
            f"new primary's timeline branched off ({int_to_lsn(split)}): the drain read changes the new primary "
            "never received (the old primary stopped before replicating them), so the log and the sinks hold "
            "changes the new primary does not have. Fix: start over from the new primary (how-to 'Recover from "
            "a gap or an invalidated slot': a new state schema, `cdc-pipeline setup`, every table backfilled "
            "into emptied sinks)")
    if cfg.drain.on_gap != "backfill":
        raise faults.DrainFatal(
            f"{what}. The changes since the drain's last position are lost to the slot: a gap. Fix: set "
            "`drain.on_gap: backfill` and start the drain again (it creates the slot and backfills the tables), "
            "or run `cdc-pipeline setup` and then backfill every table (`cdc-pipeline backfill TABLE`)")
    log.warning("drain: %s; creating it again and backfilling the gap (drain.on_gap: backfill)", what)
    slots.create(source, cfg.source.slot, cfg.source.failover and source.info.server_version >= 170000)
    return catalog.slot_position(source, cfg.source.slot) or (0, None)


def branch_point(dsn: str, timeline: int, parent: int) -> int | None:
    """Where timeline `timeline` branched off `parent` (an ancestor), from the server's timeline history
    (TIMELINE_HISTORY, a replication command); None when it cannot tell."""
    if timeline <= 1 or parent >= timeline:
        return None
    try:
        with session.connect(dsn, replication="database", autocommit=True) as conn:
            result = conn.pgconn.exec_(f"TIMELINE_HISTORY {int(timeline)}".encode())
            if result.status != pq.ExecStatus.TUPLES_OK or result.ntuples < 1:
                return None
            content = (result.get_value(0, 1) or b"").decode(errors="replace")
    except psycopg.Error:
        return None
    for line in content.splitlines():  # "<parent tli>\t<switch LSN>\t<reason>"
        fields = line.split("\t")
        if len(fields) >= 2 and fields[0].strip() == str(parent):
            high, _, low = fields[1].strip().partition("/")
            return (int(high, 16) << 32) | int(low, 16)
    return None
