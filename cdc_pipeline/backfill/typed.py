"""When a backfill reads typed rows, and their shape.

A page is read as the row's composite text (``ROW(...)::text``) instead of ``to_jsonb`` when one of the
backfill's sinks takes typed rows (its capability, `sinks.takes_typed`: a Postgres mirror that needs no
Spark work: no filter, transform, route or grouping columns, change stream) and every column's type reads
back identically in the destination: built-in types, which the mirror creates as they are, and enums (and arrays of them),
which it creates as text. Anything else (domains, composites, ranges of user types, user-defined base
types), `json` (its NUL escapes are rewritten for the JSON path), `money` (locale-dependent text) and
the `reg*` OID aliases (names resolved by the reading database's catalog) keep the JSON path for the
whole table. Other sinks of the backfill get JSON made from the typed row when they
load it (state/typed_rows.py), identical to what ``to_jsonb`` gave.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import psycopg

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import catalog
from cdc_pipeline.postgres.oids import FIRST_USER_OID, OID, OID_ALIASES, NamedOID
from cdc_pipeline.postgres.pgtypeinfo import TYPE_SQL
from cdc_pipeline.sinks import takes_typed
from cdc_pipeline.state.typed_rows import Columns

# json and money (and arrays of them) keep the JSON path, as do the OID alias types (oids.py: OID_ALIASES;
# element types too): they print as names that only the source's catalog resolves, which a state database
# elsewhere cannot parse back.
_JSON_PATH_ONLY = frozenset({OID.JSON, OID.JSON_ARRAY, NamedOID.MONEY, NamedOID.MONEY_ARRAY})


def wanted(config: PipelineConfig, sinks: Sequence[str]) -> bool:
    return any(takes_typed(config, config.sink(name)) for name in sinks)


def typed_columns(conn: psycopg.Connection, schema: str, table: str, left_out: Collection[str]) -> Columns | None:
    """The table's typed shape (name, type in the destination), or None when a column keeps the JSON path.
    ``left_out``: the generated columns a record leaves out (request.py: TableShape.generated)."""
    out: list[tuple[str, str]] = []
    for c in catalog.column_kinds(conn, schema, table):
        if c.name in left_out:
            continue
        if c.type_oid in _JSON_PATH_ONLY or c.base_oid in OID_ALIASES:
            return None
        if c.kind == "e":
            out.append((c.name, "text[]" if c.is_array else "text"))
        elif c.base_oid < FIRST_USER_OID and c.kind == "b" and TYPE_SQL.fullmatch(c.type_sql):
            out.append((c.name, c.type_sql))
        else:
            return None
    return tuple(out) if out else None
