"""What a backfill reads: the request as asked for, checked against the config, and the table's shape."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import catalog
from cdc_pipeline.postgres.pgtypeinfo import JsonKind, TextRule, json_kind, mirror_plan
from cdc_pipeline.state.backfills import BackfillError, BackfillSpec


@dataclass(frozen=True)
class BackfillRequest:
    """A backfill as asked for by the CLI or a Dagster run (resolved against the config by the runner)."""

    table: str
    sinks: tuple[str, ...] = ()  # empty: every sink that receives the table
    sort_column: str | None = None  # None: the table's sort_column when start/end are given
    start: str | None = None  # inclusive
    end: str | None = None  # exclusive
    max_query_ms: int | None = None  # None: backfill.max_query_ms from the config
    origin: str = "cli"


@dataclass(frozen=True)
class TableShape:
    schema: str
    name: str
    primary_key: tuple[str, ...]
    keyset: tuple[str, ...]
    sort_nullable: bool
    generated: tuple[str, ...]  # generated columns a record leaves out, as the stream does (catalog.streamed_generated)
    sort_indexed: bool
    columns: tuple[str, ...] = ()  # the columns a record holds
    json_columns: tuple[str, ...] = ()  # `json` columns: jsonb may refuse a value (capture/json_text.py)
    # Columns whose values may need their text in the log for a mirror (postgres/pgtypeinfo.py: TextRule).
    text_rules: tuple[tuple[str, TextRule], ...] = ()


def resolve(config: PipelineConfig, request: BackfillRequest) -> BackfillSpec:
    """The request checked against the config: table, sinks (default: all of the table's), window."""
    table = config.table(request.table)
    if request.sinks:
        for name in request.sinks:
            sink = config.sink(name)
            if table.qualified not in sink.tables:
                raise BackfillError(f"sink {name!r} does not receive {table.qualified} "
                                    f"(its tables: {', '.join(sink.tables)})")
        sinks = tuple(dict.fromkeys(request.sinks))
    else:
        sinks = tuple(s.name for s in config.sinks if table.qualified in s.tables)
        if not sinks:
            raise BackfillError(f"no sink receives {table.qualified}: add it to a sink's tables, or name one")
    sort = request.sort_column
    if sort is None and (request.start is not None or request.end is not None):
        sort = table.sort_column
        if sort is None:
            raise BackfillError(f"a start or end position needs a sort column: pass --sort-column, or set "
                                f"sort_column for {table.qualified} in the config")
    return BackfillSpec(table.qualified, tuple(sorted(sinks)), sort, request.start, request.end)


def table_shape(conn: psycopg.Connection, spec: BackfillSpec, publication: str) -> TableShape:
    """The table's key, keyset order and the generated columns ``publication`` leaves out, from the source
    catalog: a read holds the columns a change of the same row holds."""
    info = catalog.describe_table(conn, spec.schema_name, spec.table_name)
    if info is None:
        raise BackfillError(f"table {spec.table} does not exist in the source database")
    if not info.primary_key:
        raise BackfillError(f"table {spec.table} has no primary key: a backfill pages by it "
                            f"(ALTER TABLE {spec.table} ADD PRIMARY KEY (...))")
    attrs = catalog.column_flags(conn, spec.schema_name, spec.table_name)
    generated = tuple(g.name for g in catalog.streamed_generated(conn, publication, spec.schema_name,
                                                                   spec.table_name)[1])
    stored = [c for c in info.columns if c.name not in generated]
    types = catalog.load_types(conn, {c.type_oid for c in stored})
    values = {"columns": tuple(c.name for c in stored),
              "json_columns": tuple(c.name for c in stored if json_kind(types[c.type_oid]) is JsonKind.JSON),
              "text_rules": tuple((c.name, rule) for c in stored
                                  if (rule := mirror_plan(types[c.type_oid], c.type_sql).rule) is not TextRule.NEVER)}
    sort = spec.sort_column
    if sort is None:
        return TableShape(spec.schema_name, spec.table_name, info.primary_key, info.primary_key, False, generated, True,
                          **values)
    if sort not in attrs:
        raise BackfillError(f"sort column {sort!r} does not exist in {spec.table}")
    indexed = catalog.leads_an_index(conn, spec.schema_name, spec.table_name, sort)
    keyset = (sort, *(k for k in info.primary_key if k != sort))
    return TableShape(spec.schema_name, spec.table_name, info.primary_key, keyset, not attrs[sort][0], generated,
                      indexed, **values)
