"""`cdc-pipeline setup` for API sources: the state tables, and every collection's destination table
(created before the publication, so CDC can carry API data onwards from the first backfilled row)."""

from __future__ import annotations

from cdc_pipeline.api_sync import writer
from cdc_pipeline.api_sync.schema import api_schema_exists, ensure_api_schema
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import session


def setup_api_sync(config: PipelineConfig) -> list[str]:
    if not config.api_sources:
        return []
    done: list[str] = []
    with session.connect(config.state_dsn, autocommit=True) as state:
        if not api_schema_exists(state, config.state.schema_name):
            done.append(f"created api sync state tables in {config.state.schema_name}")
        ensure_api_schema(state, config.state.schema_name)
    for source in config.api_sources:
        with session.connect(source.dsn or config.source.dsn, autocommit=True) as dest:
            for coll in source.collections:
                exists = dest.execute("SELECT to_regclass(%s)", (coll.table,)).fetchone()
                writer.ensure_table(dest, coll)
                if not exists or exists[0] is None:
                    done.append(f"created table {coll.table} for api source {source.name} ({coll.name})")
    return done
