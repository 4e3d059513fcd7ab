"""Which server the drain reads its slot on, and the failovers between sessions.

At the start of every session the drain identifies the server its source connection reached (with a
multi-host `source.dsn`, whichever is the primary): address, version, timeline and system identifier. A
session on another address or timeline than the last one recorded for the slot is a failover: counted
and described in `slot_progress`, so `status`, the metrics and the change log's asset metadata can say
which server is read and that a failover happened.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

# The timeline of the WAL being written (a primary) or replayed (a standby): a promotion starts a new one.
_IDENTIFY = """
SELECT current_setting('server_version'), (SELECT system_identifier::text FROM pg_control_system()),
       pg_is_in_recovery(),
       CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END
"""


@dataclass(frozen=True)
class SourceServer:
    address: str  # host:port as the connection reached it
    version: str
    timeline: int
    system_identifier: str
    standby: bool

    def describe(self) -> str:
        role = "standby" if self.standby else "primary"
        return f"{self.address} ({role}, PostgreSQL {self.version}, timeline {self.timeline})"


def identify(conn: psycopg.Connection) -> SourceServer:
    row = conn.execute(_IDENTIFY).fetchone()
    assert row is not None
    host, port = conn.info.host, conn.info.port
    address = f"{host}:{port}" if not host.startswith("/") else f"{host}/.s.PGSQL.{port}"
    return SourceServer(address, str(row[0]).split(" ")[0], int(row[3]), str(row[1]), bool(row[2]))


def stored_server(stored: dict[str, Any] | None) -> SourceServer | None:
    return SourceServer(**stored["server"]) if stored and stored["server"] else None


def failover_between(before: SourceServer | None, now: SourceServer) -> bool:
    """Another server, or the same on a new timeline (a promotion), than the drain's last session read."""
    return before is not None and (before.address, before.timeline) != (now.address, now.timeline)


def load(state: psycopg.Connection, schema: str, slot: str) -> dict[str, Any] | None:
    """{server, failovers, last_failover} recorded for `slot`, or None (no session recorded yet, or the
    state schema is older than this record: `setup` migrates it)."""
    try:
        row = state.execute(sql.SQL("SELECT source_server, failovers, last_failover FROM {}.slot_progress "
                                    "WHERE slot = %s").format(sql.Identifier(schema)), (slot,)).fetchone()
    except psycopg.errors.UndefinedColumn:
        state.rollback()
        return None
    if row is None:
        return None
    return {"server": row[0], "failovers": int(row[1] or 0), "last_failover": row[2]}


def record(state: psycopg.Connection, schema: str, slot: str, now: SourceServer) -> str | None:
    """Record the session's server on the slot's progress row (made by the drain's first commit); returns
    the failover's description when it is one. Commits."""
    stored = load(state, schema, slot)
    if stored is None:
        return None
    before = stored_server(stored)
    moved = failover_between(before, now)
    event = None
    if moved and before is not None:
        event = {"from": asdict(before), "to": asdict(now), "at": datetime.now(UTC).isoformat()}
    state.execute(sql.SQL(
        "UPDATE {}.slot_progress SET source_server = %s, failovers = failovers + %s, "
        "last_failover = coalesce(%s, last_failover) WHERE slot = %s").format(sql.Identifier(schema)),
        (json.dumps(asdict(now)), int(moved), json.dumps(event) if event else None, slot))
    state.commit()
    if event is None or before is None:
        return None
    return f"failover: the slot was read on {before.describe()}, now on {now.describe()}"


def figures(now: SourceServer | None, stored: dict[str, Any] | None) -> dict[str, Any]:
    """`status`'s "source" section (also the metrics and the change log's asset metadata): the server a
    client reaches now through source.dsn, the one the drain read last, and the failovers recorded."""
    drained = stored_server(stored)
    last = (stored or {}).get("last_failover")
    return {
        "server": now.describe() if now else None, "address": now.address if now else None,
        "version": now.version if now else None, "timeline": now.timeline if now else None,
        "drain_server": drained.describe() if drained else None,
        "failovers": (stored or {}).get("failovers", 0),
        "last_failover_at": last["at"] if last else None,
        "last_failover": (f"{SourceServer(**last['from']).describe()} -> {SourceServer(**last['to']).describe()}"
                          if last else None),
    }
