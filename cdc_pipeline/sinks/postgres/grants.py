"""`check` for a Postgres sink: can its role do what delivery needs? Errors only (one line each, with the
fix); a sink that is fine adds nothing, so `check`'s output for a ready pipeline is unchanged."""

from __future__ import annotations

import psycopg

from cdc_pipeline.config.errors import redact
from cdc_pipeline.core.findings import Finding
from cdc_pipeline.postgres import session
from cdc_pipeline.postgres.keyset import parse_qualified
from cdc_pipeline.sinks.base import SinkConfigLike
from cdc_pipeline.sinks.postgres import OFFSETS_SCHEMA


def grant_findings(sink: SinkConfigLike) -> list[Finding]:
    dest = sink.destination
    where = f"sink {sink.name}"
    schemas = {OFFSETS_SCHEMA, *(dest.route_schemas or [])}
    for table in sink.tables:
        schema, _, name = table.partition(".")
        try:
            schemas.add(parse_qualified(dest.table.format(schema=schema, table=name))[0])
        except (ValueError, KeyError, IndexError):
            continue  # the config check reports the template
    try:
        conn = session.connect(dest.dsn, autocommit=True)
    except psycopg.Error as exc:
        return [Finding("error", where, f"cannot connect: {redact(str(exc)).strip()}")]
    out: list[Finding] = []
    with conn:
        for schema in sorted(schemas):
            row = conn.execute(
                "SELECT CASE WHEN to_regnamespace(%s::text) IS NULL "
                "THEN has_database_privilege(current_database(), 'CREATE') "
                "ELSE has_schema_privilege(%s::text, 'CREATE') AND has_schema_privilege(%s::text, 'USAGE') END",
                (schema, schema, schema)).fetchone()
            if row is None or not row[0]:
                out.append(Finding("error", where, f"the destination role may not create tables in schema "
                                   f"{schema!r}: GRANT CREATE, USAGE ON SCHEMA <schema> TO <role> (or CREATE ON "
                                   "DATABASE if the schema does not exist yet)"))
    return out
