"""The drain's logical slot: created by `setup`, as a failover slot when `source.failover` asks (17+)."""

from __future__ import annotations

import psycopg
from psycopg import pq, sql

from cdc_pipeline.postgres import session


def create(conn: psycopg.Connection, slot: str, failover: bool) -> None:
    if failover:  # (name, plugin, temporary, twophase, failover): the 5-argument form is 17+
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)", (slot,))
    else:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))


def is_failover(conn: psycopg.Connection, slot: str) -> bool | None:
    """The slot's failover flag; None when there is no such slot or the server has no such flag (<= 16)."""
    if conn.info.server_version < 170000:
        return None
    row = conn.execute("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None else bool(row[0])


def make_failover(dsn: str, slot: str) -> None:
    """ALTER_REPLICATION_SLOT, a replication command: on a replication connection, in the simple query
    protocol (psycopg's execute uses the extended one)."""
    with session.connect(dsn, replication="database", autocommit=True) as conn:
        command = sql.SQL("ALTER_REPLICATION_SLOT {} ( FAILOVER true )").format(sql.Identifier(slot))
        result = conn.pgconn.exec_(command.as_bytes(conn))
        if result.status != pq.ExecStatus.COMMAND_OK:
            message = (result.error_message or b"").decode(errors="replace").strip()
            raise psycopg.OperationalError(f"ALTER_REPLICATION_SLOT {slot}: {message}")
