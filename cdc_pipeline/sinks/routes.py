"""Which tables a Postgres sink's data-driven `route` may name.

A route is computed from row data (a Spark SQL expression), so whoever can write the source can choose
it: a value that is not a `schema.table` name is that message's failure (parked), never the run's, and
with `route_schemas` set, only tables in those schemas can be created or written.
"""

from __future__ import annotations

from collections.abc import Sequence

from cdc_pipeline.postgres.keyset import parse_qualified

MAX_IDENTIFIER_BYTES = 63  # PostgreSQL truncates longer names: two routes could meet in one table


def route_problem(route: str | None, allowed_schemas: Sequence[str] | None) -> str | None:
    """Why this message's route cannot be written (None when it can; None route = the configured table)."""
    if route is None:
        return None
    shown = repr(route[:80]).encode("unicode_escape").decode("ascii")
    try:
        schema, table = parse_qualified(route)
    except ValueError:
        return f"invalid route {shown}: not a schema.table name"
    for part in (schema, table):
        if "\x00" in part or len(part.encode()) > MAX_IDENTIFIER_BYTES:
            return f"invalid route {shown}: each name must be 1-{MAX_IDENTIFIER_BYTES} bytes without NUL"
    if schema.startswith("pg_") or schema == "information_schema":
        # pg_temp would "deliver" into a table that vanishes with the session; the others are the catalog's
        return f"route {shown} names a system schema"
    if allowed_schemas is not None and schema not in allowed_schemas:
        return f"route {shown} is outside the sink's route_schemas ({', '.join(allowed_schemas)})"
    return None
