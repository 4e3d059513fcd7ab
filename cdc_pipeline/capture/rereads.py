"""Re-reads a schema change needs: rows the source rewrote without decoding them (a volatile default, a USING
clause, a partition attached with rows). Registered as backfills of the table for its sinks once the batch
holding the change has committed, so the reads land after it; the drain runs them in its own process, as it
runs a gap's (capture/gap.py), and a drain restarted before they finish resumes them."""

from __future__ import annotations

import logging

import psycopg

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import session
from cdc_pipeline.postgres.replication import int_to_lsn

log = logging.getLogger(__name__)

ORIGIN = "drain schema change"


def register(config: PipelineConfig, source: psycopg.Connection, tables: dict[str, str], lsn: int) -> list[str]:
    """A backfill of each table (table -> why) for every sink that receives it; returns the ones registered.
    One that cannot be (another backfill of the table is running) is logged: that backfill, or
    `cdc-pipeline backfill TABLE`, reads the rows."""
    from cdc_pipeline.backfill.request import BackfillRequest, resolve, table_shape
    from cdc_pipeline.state.backfills import BackfillError, BackfillStore
    from cdc_pipeline.state.relations import record_reread_blocked

    store = BackfillStore(config.state.schema_name)
    origin = f"{ORIGIN} {int_to_lsn(lsn)}"
    done: list[str] = []
    with session.connect(config.state_dsn, autocommit=True, application_name="cdc_pipeline.drain") as state:
        for table, why in tables.items():
            try:
                spec = resolve(config, BackfillRequest(table, origin=origin))
                shape = table_shape(source, spec, config.source.publication)
                bid, _ = store.claim(state, spec, shape.primary_key, shape.keyset, origin, None)
                # Released here, not by closing the session: a backend releases its locks only once it has
                # exited, and the drain's threads look for backfills nobody holds right after this returns.
                store.release(state, bid)
            except BackfillError as exc:
                log.warning("schema change of %s (%s): its rows must be read again, but no backfill could be "
                            "started (%s): run `cdc-pipeline backfill %s`", table, why, exc, table)
                # A finding in `status` and the sink assets' metadata until such a backfill completes.
                table_schema, _, name = table.partition(".")
                record_reread_blocked(state, config.state.schema_name, table_schema, name, why, str(exc))
                continue
            log.warning("schema change of %s (%s): reading its rows again (backfill for its sinks)", table, why)
            done.append(table)
    return done
