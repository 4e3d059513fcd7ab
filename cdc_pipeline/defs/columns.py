"""`dagster/column_schema` for the assets whose columns are known: a table's columns as the drain (or a
backfill) last recorded them in the state database (state/relations.py), so they follow schema changes."""

from __future__ import annotations

from dagster import MetadataValue, TableColumn, TableColumnConstraints, TableSchema

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.defs.tags import COLUMN_SCHEMA
from cdc_pipeline.postgres import session
from cdc_pipeline.state import relations


def column_schema(pipeline: PipelineConfig, table: str) -> dict[str, MetadataValue]:
    """{COLUMN_SCHEMA: the table's columns}, or nothing while none are recorded."""
    with session.connect(pipeline.state_dsn, autocommit=True) as conn:
        info = relations.table_info(conn, pipeline.state.schema_name, table)
    if info is None or not info.columns:
        return {}
    columns = [TableColumn(c.name, c.type_sql, description="primary key" if c.in_primary_key else None,
                           constraints=TableColumnConstraints(nullable=False) if c.in_primary_key else None)
               for c in info.columns]
    return {COLUMN_SCHEMA: MetadataValue.table_schema(TableSchema(columns=columns))}


def sink_table(sink: SinkConfig) -> str | None:
    """The source table whose columns a sink holds as they are: a sink of one table without a transform
    or an enrichment (which change the columns)."""
    if len(sink.tables) != 1 or sink.transform is not None or sink.enrichment is not None:
        return None
    return sink.tables[0]
