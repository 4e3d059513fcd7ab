"""`cdc-pipeline check`: say what is wrong with the source, the state database and the sinks, one finding
per line, with the fix."""

from __future__ import annotations

import psycopg

from cdc_pipeline.admin import ddl_capture, generated, partitioned
from cdc_pipeline.admin.server_checks import server_findings
from cdc_pipeline.config import PipelineConfig, TableConfig, redact
from cdc_pipeline.core.findings import Finding
from cdc_pipeline.postgres import catalog, session
from cdc_pipeline.sinks import sink_class
from cdc_pipeline.state.schema import pending_migrations

__all__ = ["Finding", "check"]


def check(config: PipelineConfig, sinks: bool = True) -> list[Finding]:
    """Source readiness, then (with `sinks`) each sink's filter/transform/route analyzed by Spark.

    What `setup` creates (publication, tables added to it, slot, state schema) is reported as "todo",
    not as an error: `check && setup` is the way to start. Errors are what blocks capture."""
    out: list[Finding] = []
    described: dict[str, catalog.TableInfo] = {}
    try:
        conn = session.connect(config.source.dsn, autocommit=True)
    except psycopg.Error as exc:  # a parse error (ProgrammingError) quotes the DSN too: redacted below
        return [Finding("error", "source", f"cannot connect: {redact(str(exc)).strip()}")]
    with conn:
        out += server_findings(conn, config)
        wal_level = catalog.setting(conn, "wal_level")
        if wal_level != "logical":
            out.append(Finding("error", "source", f"wal_level is {wal_level!r}, must be 'logical': "
                               "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"))
        if not catalog.can_replicate(conn):
            out.append(Finding("error", "source", "the user lacks the REPLICATION privilege: "
                               "ALTER ROLE <user> WITH REPLICATION"))
        owned = _each_table(conn, config, described, out)
        out += _publication_findings(conn, config, owned)
        out += partitioned.findings(conn, config)
        out += generated.findings(conn, config)
        out += ddl_capture.findings(conn, config)
        slot = catalog.slot_info(conn, config.source.slot)
        if slot is None:
            out.append(Finding("todo", "slot", f"{config.source.slot!r} does not exist yet: "
                               "`cdc-pipeline setup` creates it"))
        else:
            out += _slot_findings(config.source.slot, slot, conn.info.dbname)
    out += _state_findings(config)
    if not any(f.level == "error" for f in out):
        todo = any(f.level == "todo" for f in out)
        out.append(Finding("ok", "source", "ready for change data capture"
                           + (" once `cdc-pipeline setup` has created what is listed above" if todo else "")))
    if sinks:
        from cdc_pipeline.delivery.enrichment import check_enrichment
        from cdc_pipeline.delivery.validate import validate_sinks  # imports pyspark: only when asked

        for sink in config.sinks:  # what each sink's own destination lacks (a role's grants, say)
            out += sink_class(sink).check_findings(sink)
        out += validate_sinks(config, described)
        out += check_enrichment(config.sinks, config.source.dsn, described)
    return out


def _each_table(conn: psycopg.Connection, config: PipelineConfig, described: dict[str, catalog.TableInfo],
                out: list[Finding]) -> dict[str, bool]:
    """Each configured table's findings into `out`, its description into `described`; returns which tables
    the user owns."""
    owned: dict[str, bool] = {}
    for t in config.tables:
        info = catalog.describe_table(conn, t.schema_name, t.table_name)
        if info is None:
            feeder = _api_feeder(config, t.qualified)
            out.append(Finding("todo", t.qualified, f"does not exist yet: `setup` creates it for api source "
                               f"{feeder}") if feeder else Finding("error", t.qualified, "table does not exist"))
            continue
        described[t.qualified] = info
        privileges = catalog.privileges(conn, t.schema_name, t.table_name)
        owned[t.qualified] = privileges["owner"]
        out += _table_findings(t, info)
        out += _value_findings(conn, config, t)
        if not privileges["select"]:
            out.append(Finding("warning", t.qualified, "the user cannot read the table, so backfills of it "
                               f"fail: GRANT SELECT ON {t.qualified} TO <user>"))
    return owned


def _value_findings(conn: psycopg.Connection, config: PipelineConfig, t: TableConfig) -> list[Finding]:
    """Columns whose values arrive exactly only under conditions (README: Values exactly as PostgreSQL
    holds them)."""
    out: list[Finding] = []
    # Sinks that write the source's values themselves (a Postgres mirror), rather than messages.
    mirrors = [s.name for s in config.sinks if t.qualified in s.tables and sink_class(s).takes_texts(s)]
    monetary = catalog.setting(conn, "lc_monetary")
    for column, why in catalog.inexact_columns(conn, t.schema_name, t.table_name).items():
        if why == "money" and mirrors:
            out.append(Finding("warning", t.qualified, f"column {column!r} is money, whose text depends on "
                               f"lc_monetary ({monetary!r} here): mirror(s) {', '.join(mirrors)} hold it exactly only "
                               "with the same lc_monetary; or ALTER the column to numeric"))
        elif why == "jsonb cast":
            out.append(Finding("warning", t.qualified, f"column {column!r} has a type with a cast to jsonb: records "
                               "carry its text as a string, where to_jsonb(row) would use the cast"))
    return out


def _table_findings(t: TableConfig, info: catalog.TableInfo) -> list[Finding]:
    """What keeps a table's changes from being keyed, grouped and applied correctly."""
    out: list[Finding] = []
    q = t.qualified
    if not info.primary_key:
        out.append(Finding("error", q, f"table has no primary key: ALTER TABLE {q} ADD PRIMARY KEY (...)"))
    names = {c.name for c in info.columns}
    for col in [t.sort_column, *(t.group_columns or [])]:
        if col and col not in names:
            out.append(Finding("error", q, f"column {col!r} (from the config) does not exist"))
    identity = set(info.identity_columns)
    if info.replica_identity == "n":
        out.append(Finding("error", q, "REPLICA IDENTITY NOTHING: PostgreSQL refuses UPDATE and DELETE on a "
                           f"published table without a replica identity: ALTER TABLE {q} REPLICA IDENTITY DEFAULT"))
        return out
    if info.primary_key and not set(info.primary_key) <= identity:
        # A DELETE's old tuple carries only the identity index's columns: no primary key to delete by,
        # and an UPDATE of the key that leaves the index's columns alone sends no old key at all.
        out.append(Finding("error", q, f"REPLICA IDENTITY USING INDEX on ({', '.join(info.identity_columns)}), "
                           f"which lacks primary-key column(s) {', '.join(c for c in info.primary_key if c not in identity)}"
                           ": a delete (or an update of the key) would not carry the primary key, so the mirror "
                           f"could not apply it: ALTER TABLE {q} REPLICA IDENTITY DEFAULT (or FULL)"))
    ungrouped = [c for c in (t.group_columns or []) if c in names and c not in identity]
    if ungrouped:
        out.append(Finding("error", q, f"group_columns {', '.join(ungrouped)} are not in the replica identity "
                           f"({', '.join(info.identity_columns)}): a delete's old tuple does not carry them, so "
                           "every delete would fall outside its group and could overtake or be overtaken by its "
                           f"group's other changes: ALTER TABLE {q} REPLICA IDENTITY FULL"))
    toastable = [c.name for c in info.columns if c.toastable]
    if info.replica_identity in ("d", "i") and toastable:
        out.append(Finding("warning", q, f"REPLICA IDENTITY {'DEFAULT' if info.replica_identity == 'd' else 'USING INDEX'}"
                           f" with TOAST-able columns ({', '.join(toastable)}): an update that leaves them "
                           "unchanged cannot carry their values, and `changes` holds no old values; "
                           f"ALTER TABLE {q} REPLICA IDENTITY FULL"))
    return out


def _publication_findings(conn: psycopg.Connection, config: PipelineConfig, owned: dict[str, bool]) -> list[Finding]:
    pub = config.source.publication
    published = catalog.publication_tables(conn, pub)
    if published is None:
        if not catalog.can_create_in_database(conn):
            return [Finding("error", "publication", f"{pub!r} does not exist and the user may not create it "
                            "(CREATE on the database): GRANT CREATE ON DATABASE <db> TO <user>, or have an owner "
                            f"run CREATE PUBLICATION {pub} FOR TABLE ...")]
        not_owned = [q for q, own in owned.items() if not own]
        if not_owned:
            return [Finding("error", "publication", f"{pub!r} does not exist and the user does not own "
                            f"{', '.join(not_owned)}, which CREATE PUBLICATION requires: have the owner create it")]
        return [Finding("todo", "publication", f"{pub!r} does not exist yet: `cdc-pipeline setup` creates it for "
                        f"{', '.join(owned) or 'the configured tables'}")]
    out: list[Finding] = []
    actions = catalog.publication_actions(conn, pub)
    dropped = [a for a in ("insert", "update", "delete", "truncate") if not actions.get(a, True)]
    if dropped:
        out.append(Finding("error", "publication", f"{pub!r} does not publish {', '.join(dropped)}: those changes "
                           f"would never reach the log: ALTER PUBLICATION {pub} SET (publish = "
                           "'insert, update, delete, truncate')"))
    missing = [t.qualified for t in config.tables if t.qualified not in published and t.qualified in owned]
    blocked = [q for q in missing if not owned[q]]
    if blocked:
        out.append(Finding("error", "publication", f"{pub!r} lacks {', '.join(blocked)} and the user does not own "
                           f"it: have the owner run ALTER PUBLICATION {pub} ADD TABLE {', '.join(blocked)}"))
    elif missing:
        out.append(Finding("todo", "publication", f"{pub!r} lacks {', '.join(missing)}: `cdc-pipeline setup` "
                           "adds them"))
    return out


def _slot_findings(name: str, slot: dict[str, object], database: str) -> list[Finding]:
    drop = f"SELECT pg_drop_replication_slot('{name}') and run `cdc-pipeline setup`"
    if slot["database"] != database:
        return [Finding("error", "slot", f"{name!r} belongs to database {slot['database']!r}, not {database!r}: "
                        f"name another slot in source.slot, or {drop} in {slot['database']!r}")]
    if slot["plugin"] != "pgoutput":
        return [Finding("error", "slot", f"{name!r} uses plugin {slot['plugin']!r}, not pgoutput: {drop}")]
    if slot["wal_status"] == "lost":
        return [Finding("error", "slot", f"{name!r} is invalidated (wal_status lost: the WAL it needed was "
                        f"removed, changes were missed): {drop}, then backfill the tables")]
    return []


def _state_findings(config: PipelineConfig) -> list[Finding]:
    schema = config.state.schema_name
    try:
        state = session.connect(config.state_dsn, autocommit=True)
    except psycopg.Error as exc:  # a parse error (ProgrammingError) quotes the DSN too: redacted below
        return [Finding("error", "state", f"cannot connect: {redact(str(exc)).strip()}")]
    with state:
        pending = pending_migrations(state, schema)
        if pending is None:
            if not catalog.can_create_in_database(state):
                return [Finding("error", "state", f"schema {schema!r} does not exist and the user may not create "
                                "it: GRANT CREATE ON DATABASE <db> TO <user>")]
            return [Finding("todo", "state", f"schema {schema!r} does not exist yet: `cdc-pipeline setup` creates it")]
        if pending:
            return [Finding("todo", "state", f"schema {schema!r} needs {pending} migration(s): `cdc-pipeline setup` "
                            "applies them")]
    return []


def _api_feeder(config: PipelineConfig, table: str) -> str | None:
    """The API source that writes ``table`` into the source database (setup creates the table)."""
    for source in config.api_sources:
        if source.dsn in (None, config.source.dsn) and any(c.table == table for c in source.collections):
            return source.name
    return None
