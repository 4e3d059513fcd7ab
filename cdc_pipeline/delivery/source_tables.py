"""What a delivery asks of the source tables' descriptions (kept in the state database): a table's shape for the
sink, read on the session's state connection; a table's primary key columns for the row streams' deletes
and the enrichment, read once; and every relation's columns, for a stage that builds records."""

from __future__ import annotations

import psycopg

from cdc_pipeline.postgres import session
from cdc_pipeline.postgres.catalog import TableInfo
from cdc_pipeline.state import relations
from cdc_pipeline.state.base import StateError


class SourceTables:
    def __init__(self, schema: str, state_dsn: str) -> None:
        self.schema = schema  # the state schema, where capture records the relations
        self.state_dsn = state_dsn
        self._keys: dict[str, tuple[str, ...]] = {}

    def describe(self, conn: psycopg.Connection, table: str) -> TableInfo | None:
        """A source table's description (its errors are the state database's)."""
        try:
            return relations.table_info(conn, self.schema, table)
        except psycopg.Error as exc:
            raise StateError(f"describing {table}: {type(exc).__name__}") from exc

    def primary_key(self, table: str) -> tuple[str, ...]:
        if table not in self._keys:
            with session.connect(self.state_dsn) as conn:
                info = relations.table_info(conn, self.schema, table)
            self._keys[table] = info.primary_key if info else ()
        return self._keys[table]

    def columns(self, conn: psycopg.Connection) -> dict[str, list[dict[str, object]]]:
        """Every recorded relation's columns, by table."""
        return relations.relation_columns(conn, self.schema)
