"""`cdc-pipeline setup`: make the source ready (publication, slot, state schema); running it twice changes
nothing. It refuses while `check` reports an error."""

from __future__ import annotations

import psycopg
from psycopg import sql

from cdc_pipeline.admin import ddl_capture, generated, partitioned
from cdc_pipeline.admin.check import check
from cdc_pipeline.config import PipelineConfig, redact
from cdc_pipeline.postgres import catalog, session, slots, standby
from cdc_pipeline.state.schema import ensure_schema

__all__ = ["SetupError", "setup"]


class SetupError(RuntimeError):
    pass


def setup(config: PipelineConfig) -> list[str]:
    """Create what is missing; running it twice changes nothing. Returns what it did."""
    from cdc_pipeline.api_sync.setup import setup_api_sync

    # Sink expressions are not setup's business (and would start Spark): source findings only.
    blocking = [f for f in check(config, sinks=False) if f.level == "error"]
    if blocking:
        raise SetupError("\n".join(str(f) for f in blocking))
    # API sync's destination tables before the publication: they may be among the tables it captures.
    done: list[str] = setup_api_sync(config)
    # Reach the state database before creating anything, and create the slot last: a slot left behind
    # by a failed setup would hold WAL on the source for good.
    try:
        state = session.connect(config.state_dsn)
    except psycopg.Error as exc:  # a parse error (ProgrammingError) quotes the DSN too: redacted below
        raise SetupError(f"ERROR   state: cannot connect: {redact(str(exc)).strip()}") from exc
    # A standby as the source (source.primary_dsn): the publication and the schema-change trigger are made on
    # its primary (they reach the standby by replay), the slot on the standby itself.
    with state, session.connect(config.primary_dsn, autocommit=True) as conn, \
            session.connect(config.source.dsn, autocommit=True) as source:
        pub = config.source.publication
        published = catalog.publication_tables(conn, pub)
        tables = [sql.Identifier(t.schema_name, t.table_name) for t in config.tables]
        if not tables:
            pass  # API sync only: nothing to capture, so no publication and no slot holding WAL
        elif published is None:
            conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH ({})").format(
                sql.Identifier(pub), sql.SQL(", ").join(tables),
                sql.SQL(", ").join([partitioned.CREATE_OPTION, *generated.create_options(conn)])))
            done.append(f"created publication {pub} for {len(tables)} table(s)")
        else:
            done += partitioned.bring_to_root(conn, config)  # first: until then a parent lists as its leaves
            done += generated.bring_to_stored(conn, config)
            published = catalog.publication_tables(conn, pub) or set()
            missing = [sql.Identifier(t.schema_name, t.table_name) for t in config.tables
                       if t.qualified not in published]
            if missing:
                conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                    sql.Identifier(pub), sql.SQL(", ").join(missing)))
                done.append(f"added {len(missing)} table(s) to publication {pub}")
        if ensure_schema(state, config.state.schema_name):
            done.append(f"created state schema {config.state.schema_name}")
        if tables:
            done += ddl_capture.install(conn, config)  # schema changes at their position (admin/ddl_capture.py)
        if tables and catalog.slot_info(source, config.source.slot) is None:
            if config.source.primary_dsn:
                # The standby must have replayed the publication first, and its slot waits for a running-xacts
                # record from the primary: asked for here rather than waited for (up to 15 s).
                standby.wait_replayed(source, conn)
                with standby.snapshots_logged(config.source.primary_dsn):
                    slots.create(source, config.source.slot, False)
            else:
                slots.create(source, config.source.slot, config.source.failover)
            done.append(f"created {'failover ' if config.source.failover else ''}replication slot "
                        f"{config.source.slot}")
        elif tables and config.source.failover and slots.is_failover(source, config.source.slot) is False:
            slots.make_failover(config.source.dsn, config.source.slot)
            done.append(f"made replication slot {config.source.slot} a failover slot")
    return done
