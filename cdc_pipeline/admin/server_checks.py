"""`check`'s findings about the source server itself: its version (what it enables or lacks) and, with
`source.failover: true`, what the primary can tell about failover slots (PostgreSQL 17+).

A primary cannot see its standbys' settings: what must be set there is said, not verified."""

from __future__ import annotations

import psycopg

from cdc_pipeline.config import PipelineConfig, redact
from cdc_pipeline.core.findings import Finding
from cdc_pipeline.postgres import catalog, session, standby
from cdc_pipeline.postgres.server import ServerVersion

STANDBY_SETTINGS = ("on each standby that may be promoted: sync_replication_slots = on, hot_standby_feedback = on, "
                    "wal_level = logical, primary_slot_name = <its physical slot, listed in the primary's "
                    "synchronized_standby_slots>, and dbname=<the source database> in primary_conninfo")


def server_version(conn: psycopg.Connection) -> ServerVersion:
    return ServerVersion(conn.info.server_version, catalog.setting(conn, "server_version").split(" ")[0])


def server_findings(conn: psycopg.Connection, config: PipelineConfig) -> list[Finding]:
    version = server_version(conn)
    level, text = version.summary()
    out = [Finding(level, "server", text)]
    out += mode_findings(conn, config, version)
    if config.source.failover:
        out += failover_findings(conn, config.source.slot, version)
    return out


def mode_findings(conn: psycopg.Connection, config: PipelineConfig, version: ServerVersion) -> list[Finding]:
    """Whether the source is a primary or a standby (decoding there, PostgreSQL 16+, with source.primary_dsn
    for the writes a standby cannot take)."""
    primary_dsn = config.source.primary_dsn
    if not _in_recovery(conn):
        if primary_dsn:
            return [Finding("warning", "mode", "source.dsn reaches a primary: source.primary_dsn is not needed (it "
                            "is for a standby as the source); the drain reads the slot on source.dsn")]
        return [Finding("ok", "mode", "primary: the slot, the publication and the watermarks on source.dsn")]
    if conn.info.server_version < standby.MIN_VERSION:
        return [Finding("error", "mode", f"source.dsn reaches a standby of PostgreSQL {version.text}: decoding on a "
                        "standby needs 16+; point source.dsn at the primary")]
    if not primary_dsn:
        return [Finding("error", "mode", "source.dsn reaches a standby, and source.primary_dsn is not set: set "
                        "source.primary_dsn to its primary (the publication, the drain's heartbeats and the "
                        "backfills' watermarks are written there); or point source.dsn at the primary")]
    try:
        with session.connect(primary_dsn, autocommit=True) as primary:
            if _in_recovery(primary):
                return [Finding("error", "mode", "source.primary_dsn reaches a standby too: it must name the primary")]
            if _system_id(primary) != _system_id(conn):
                return [Finding("error", "mode", "source.primary_dsn reaches another cluster than the standby of "
                                "source.dsn replicates: it must name that standby's primary")]
    except psycopg.Error as exc:
        return [Finding("error", "mode", f"source.primary_dsn: cannot connect: {redact(str(exc)).strip()}")]
    out = [Finding("ok", "mode", "standby: the slot is read on the standby (source.dsn); the publication, "
                   "heartbeats and watermarks are written on the primary (source.primary_dsn)")]
    if catalog.setting(conn, "hot_standby_feedback") != "on":
        out.append(Finding("warning", "mode", "hot_standby_feedback is off on the standby: the primary may remove "
                           "catalog rows the slot still needs, which invalidates it; set it on and reload"))
    return out


def _system_id(conn: psycopg.Connection) -> str:
    row = conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()
    return str(row[0]) if row else ""


def failover_findings(conn: psycopg.Connection, slot: str, version: ServerVersion) -> list[Finding]:
    if not version.has("failover_slots"):
        return [Finding("error", "failover", f"source.failover needs failover slots (PostgreSQL 17+), and the server "
                        f"is {version.text}: a promotion loses the slot there (the drain then reports a gap); set "
                        "source.failover: false, or upgrade")]
    if _in_recovery(conn):
        return [Finding("error", "failover", "source.dsn reaches a standby: failover slots are made and checked on "
                        "the primary; name it first (or use target_session_attrs=read-write)")]
    out: list[Finding] = []
    listed = [s.strip() for s in catalog.setting(conn, "synchronized_standby_slots").split(",") if s.strip()]
    if not listed:
        out.append(Finding("warning", "failover", "synchronized_standby_slots is empty on the primary: the drain may "
                           "receive changes a standby has not, which a promotion of it would not have; ALTER SYSTEM "
                           "SET synchronized_standby_slots = '<the standby's physical slot>' and reload"))
    physical = _physical_slots(conn)
    for name in listed:
        if name not in physical:
            out.append(Finding("error", "failover", f"synchronized_standby_slots names {name!r}, which is no physical "
                               "slot on the primary: logical walsenders (the drain) wait for it; create it for the "
                               "standby (pg_create_physical_replication_slot) or remove it from the setting"))
        elif not physical[name]:
            out.append(Finding("warning", "failover", f"physical slot {name!r} (synchronized_standby_slots) has no "
                               "standby connected: the drain waits until it comes back"))
    flag = _slot_failover(conn, slot)
    if flag is False:
        out.append(Finding("todo", "failover", f"slot {slot!r} is not a failover slot: `cdc-pipeline setup` makes it "
                           "one (ALTER_REPLICATION_SLOT ... (FAILOVER true))"))
    if not any(f.level == "error" for f in out):
        out.append(Finding("ok", "failover", f"slot {slot!r} {'is' if flag else 'will be'} a failover slot; "
                           + STANDBY_SETTINGS))
    return out


def _in_recovery(conn: psycopg.Connection) -> bool:
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def _physical_slots(conn: psycopg.Connection) -> dict[str, bool]:
    rows = conn.execute("SELECT slot_name, active FROM pg_replication_slots WHERE slot_type = 'physical'").fetchall()
    return {str(r[0]): bool(r[1]) for r in rows}


def _slot_failover(conn: psycopg.Connection, slot: str) -> bool | None:
    """The slot's failover flag (17+), None when there is no such slot."""
    row = conn.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None else bool(row[0])
