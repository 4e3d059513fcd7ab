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

from cdc_pipeline.capture import faults, source_server
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import catalog, slots

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
    if cfg.drain.on_gap != "backfill":
        raise faults.DrainFatal(
            f"{what}. The changes since the drain's last position are lost to the slot: a gap. Fix: set "
            "`drain.on_gap: backfill` and start the drain again (it creates the slot and backfills the tables), "
            "or run `cdc-pipeline setup` and then backfill every table (`cdc-pipeline backfill TABLE`)")
    log.warning("drain: %s; creating it again and backfilling the gap (drain.on_gap: backfill)", what)
    slots.create(source, cfg.source.slot, cfg.source.failover and source.info.server_version >= 170000)
    return catalog.slot_position(source, cfg.source.slot) or (0, None)
