"""`cdc-pipeline setup` and `check`: make the source ready (publication, slot, state schema) and say
what is wrong with it, one finding per line, with the fix."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from cdc_pipeline.config import PipelineConfig, redact
from cdc_pipeline.postgres import catalog
from cdc_pipeline.state.schema import ensure_schema


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning" | "ok"
    subject: str
    message: str

    def __str__(self) -> str:
        return f"{self.level.upper():7} {self.subject}: {self.message}"


def check(config: PipelineConfig, sinks: bool = True) -> list[Finding]:
    """Source readiness, then (with `sinks`) each sink's filter/transform/route analyzed by Spark."""
    out: list[Finding] = []
    described: dict[str, catalog.TableInfo] = {}
    try:
        conn = psycopg.connect(config.source.dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        return [Finding("error", "source", f"cannot connect: {redact(str(exc)).strip()}")]
    with conn:
        wal_level = catalog.setting(conn, "wal_level")
        if wal_level != "logical":
            out.append(Finding("error", "source", f"wal_level is {wal_level!r}, must be 'logical': "
                               "ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL"))
        if not catalog.can_replicate(conn):
            out.append(Finding("error", "source", "the user lacks the REPLICATION privilege: "
                               "ALTER ROLE <user> WITH REPLICATION"))
        for t in config.tables:
            info = catalog.describe_table(conn, t.schema_name, t.table_name)
            if info is None:
                out.append(Finding("error", t.qualified, "table does not exist"))
                continue
            described[t.qualified] = info
            if not info.primary_key:
                out.append(Finding("error", t.qualified, "table has no primary key: "
                                   f"ALTER TABLE {t.qualified} ADD PRIMARY KEY (...)"))
            names = {c.name for c in info.columns}
            for col in [t.sort_column, *(t.group_columns or [])]:
                if col and col not in names:
                    out.append(Finding("error", t.qualified, f"column {col!r} (from the config) does not exist"))
            toastable = [c.name for c in info.columns if c.toastable]
            if info.replica_identity == "d" and toastable:
                out.append(Finding("warning", t.qualified, "REPLICA IDENTITY DEFAULT with TOAST-able columns "
                                   f"({', '.join(toastable)}): an update that leaves them unchanged cannot "
                                   "carry their values, and `changes` holds no old values; "
                                   f"ALTER TABLE {t.qualified} REPLICA IDENTITY FULL"))
        published = catalog.publication_tables(conn, config.source.publication)
        if published is None:
            out.append(Finding("error", "publication", f"{config.source.publication!r} does not exist: "
                               "run `cdc-pipeline setup`"))
        else:
            missing = [t.qualified for t in config.tables if t.qualified not in published]
            if missing:
                out.append(Finding("error", "publication", f"{config.source.publication!r} lacks "
                                   f"{', '.join(missing)}: run `cdc-pipeline setup`"))
        slot = catalog.slot_info(conn, config.source.slot)
        if slot is None:
            out.append(Finding("error", "slot", f"{config.source.slot!r} does not exist: run `cdc-pipeline setup`"))
        elif slot["plugin"] != "pgoutput":
            out.append(Finding("error", "slot", f"{config.source.slot!r} uses plugin {slot['plugin']!r}, "
                               "not pgoutput: drop it and run `cdc-pipeline setup`"))
    if not any(f.level == "error" for f in out):
        out.append(Finding("ok", "source", "ready for change data capture"))
    if sinks:
        from cdc_pipeline.delivery.validate import validate_sinks  # imports pyspark: only when asked

        out += validate_sinks(config, described)
    return out


class SetupError(RuntimeError):
    pass


def setup(config: PipelineConfig) -> list[str]:
    """Create what is missing; running it twice changes nothing. Returns what it did."""
    # Sink expressions are not setup's business (and would start Spark): source findings only.
    blocking = [f for f in check(config, sinks=False)
                if f.level == "error" and f.subject not in ("publication", "slot")]
    if blocking:
        raise SetupError("\n".join(str(f) for f in blocking))
    done: list[str] = []
    # Reach the state database before creating anything, and create the slot last: a slot left behind
    # by a failed setup would hold WAL on the source for good.
    try:
        state = psycopg.connect(config.state_dsn, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise SetupError(f"ERROR   state: cannot connect: {redact(str(exc)).strip()}") from exc
    with state, psycopg.connect(config.source.dsn, autocommit=True) as conn:
        pub = config.source.publication
        published = catalog.publication_tables(conn, pub)
        tables = [sql.Identifier(t.schema_name, t.table_name) for t in config.tables]
        if published is None:
            conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(pub), sql.SQL(", ").join(tables)))
            done.append(f"created publication {pub} for {len(tables)} table(s)")
        else:
            missing = [sql.Identifier(t.schema_name, t.table_name) for t in config.tables
                       if t.qualified not in published]
            if missing:
                conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
                    sql.Identifier(pub), sql.SQL(", ").join(missing)))
                done.append(f"added {len(missing)} table(s) to publication {pub}")
        if ensure_schema(state, config.state.schema_name):
            done.append(f"created state schema {config.state.schema_name}")
        if catalog.slot_info(conn, config.source.slot) is None:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (config.source.slot,))
            done.append(f"created replication slot {config.source.slot}")
    return done
