"""STORED generated columns in `check` and `setup`: from PostgreSQL 18 a publication carries their values
when created (or altered) with `publish_generated_columns = stored`, so a change holds them as a read does.
Before 18 pgoutput never sends them: records leave them out on both paths and a Postgres mirror computes
them with the source's expression (docs/explanation/values.md)."""

from __future__ import annotations

import psycopg
from psycopg import sql

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.core.findings import Finding
from cdc_pipeline.postgres import catalog


def _with_stored(config: PipelineConfig, conn: psycopg.Connection) -> list[str]:
    return [t.qualified for t in config.tables
            if any(g.stored for g in catalog.generated_columns(conn, t.schema_name, t.table_name))]


def _lacking(conn: psycopg.Connection, pub: str) -> bool:
    """An existing publication on 18+ that does not publish generated columns."""
    return (conn.info.server_version >= 180000 and catalog.publication_tables(conn, pub) is not None
            and not catalog.publishes_generated(conn, pub))


def create_options(conn: psycopg.Connection) -> list[sql.Composable]:
    """The publication option setup adds on 18+ (harmless for tables without generated columns)."""
    return [sql.SQL("publish_generated_columns = stored")] if conn.info.server_version >= 180000 else []


def findings(conn: psycopg.Connection, config: PipelineConfig) -> list[Finding]:
    """An existing publication without publish_generated_columns while a configured table has a STORED
    generated column (a todo: `setup` sets it)."""
    pub = config.source.publication
    if not _lacking(conn, pub):
        return []
    tables = _with_stored(config, conn)
    if not tables:
        return []
    return [Finding("todo", "publication", f"{pub!r} does not publish generated columns while {', '.join(tables)} "
                    f"has STORED ones: changes would leave them out: `cdc-pipeline setup` runs ALTER PUBLICATION "
                    f"{pub} SET (publish_generated_columns = stored), after which changes and reads hold them")]


def bring_to_stored(conn: psycopg.Connection, config: PipelineConfig) -> list[str]:
    """Set publish_generated_columns on an existing publication on 18+ (what `findings` reports)."""
    pub = config.source.publication
    if not _lacking(conn, pub):
        return []
    conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish_generated_columns = stored)").format(sql.Identifier(pub)))
    return [f"set publish_generated_columns = stored on publication {pub}"]
