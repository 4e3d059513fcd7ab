"""Database sessions: the options every cdc_pipeline session shares, connects, advisory locks, pools.

Every session gets:
  * the value-printing settings readers and writers of record JSON must agree on (capture/json_text.py),
    and client_encoding UTF8 (text crosses sessions as bytes);
  * a connect timeout, and TCP keepalives on both ends: client side (libpq ``keepalives*``,
    ``tcp_user_timeout``) so a dead server is noticed, server side (``tcp_keepalives_*``,
    ``tcp_user_timeout`` via ``options``) so a partitioned client's backend, and with it its advisory
    locks and its replication slot, is released in about a minute instead of ~2 h of kernel defaults;
  * optionally ``statement_timeout``/``lock_timeout`` (never on the replication stream or huge COPYs);
  * for the state database's log writer, durable commits and ``READ COMMITTED`` forced explicitly.

The user's DSN is kept: its ``options`` are merged with ours (ours that must hold come last, so they
win: PostgreSQL applies ``-c`` settings in order), and libpq parameters it sets are not overridden.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import conninfo as ci
from psycopg import sql

# Sessions that read or write record JSON must agree on how values print (see capture/json_text.py).
# And on the bytes of text: typed reads are relayed as COPY bytes from the state session into a mirror's
# (delivery/relay.py), so every session speaks UTF-8 and each server converts to its own encoding (a
# character a LATIN1 mirror cannot hold is then that message's error, not a changed character).
JSON_OPTIONS = ("-c TimeZone=UTC", "-c DateStyle=ISO,YMD", "-c IntervalStyle=postgres", "-c extra_float_digits=1",
                "-c bytea_output=hex", "-c client_encoding=UTF8")
CLIENT_ENCODING = "UTF8"
SESSION_OPTIONS = " ".join(JSON_OPTIONS)

CONNECT_TIMEOUT_S = 10
# Client side: probe an idle connection after 10 s, every 5 s, give up after 3 misses; unacknowledged
# data fails the connection after 30 s.
CLIENT_KEEPALIVES = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
                     "keepalives_count": "3", "tcp_user_timeout": "30000"}
# Server side, the same: a partitioned client's backend ends (releasing its locks) in ~25-30 s.
SERVER_KEEPALIVES = ("-c tcp_keepalives_idle=10", "-c tcp_keepalives_interval=5", "-c tcp_keepalives_count=3",
                     "-c tcp_user_timeout=30000")
# The log writer's commits must survive a server crash or failover before the slot is acknowledged;
# and a staged backfill page must be visible to the drain's next statement (not under repeatable read).
DURABLE = ("-c synchronous_commit=on", r"-c default_transaction_isolation=read\ committed")


def conninfo(dsn: str, *, statement_timeout_ms: int | None = None, lock_timeout_ms: int | None = None,
             durable: bool = False, application_name: str | None = None) -> str:
    """``dsn`` with our session settings merged in (see the module docstring)."""
    params: dict[str, Any] = ci.conninfo_to_dict(dsn)
    defaults = list(SERVER_KEEPALIVES)  # the user's options may override these
    if statement_timeout_ms is not None:
        defaults.append(f"-c statement_timeout={int(statement_timeout_ms)}")
    if lock_timeout_ms is not None:
        defaults.append(f"-c lock_timeout={int(lock_timeout_ms)}")
    forced = [*JSON_OPTIONS, *(DURABLE if durable else ())]  # these must hold whatever the user set
    user = str(params.get("options") or "").strip()
    params["options"] = " ".join([*defaults, *([user] if user else []), *forced])
    params["client_encoding"] = CLIENT_ENCODING  # over PGCLIENTENCODING and the DSN's own
    params.setdefault("connect_timeout", str(CONNECT_TIMEOUT_S))
    for key, value in CLIENT_KEEPALIVES.items():
        params.setdefault(key, value)
    if application_name:
        params.setdefault("application_name", application_name)
    return ci.make_conninfo(**params)


def connect(dsn: str, *, statement_timeout_ms: int | None = None, lock_timeout_ms: int | None = None,
            durable: bool = False, application_name: str | None = None, **kwargs: Any) -> psycopg.Connection:
    """``psycopg.connect`` with our session settings (``kwargs``: autocommit, replication, ...)."""
    info = conninfo(dsn, statement_timeout_ms=statement_timeout_ms, lock_timeout_ms=lock_timeout_ms,
                    durable=durable, application_name=application_name)
    return psycopg.connect(info, **kwargs)


# SQLSTATEs of a session the server ended: admin_shutdown (a fast or smart stop, a restart),
# crash_shutdown, cannot_connect_now (still starting or stopping).
_SERVER_GONE = ("57P01", "57P02", "57P03")


def connection_lost(exc: BaseException) -> bool:
    """The session is gone or could not be opened (a server restart, a network cut): a new one may work.
    Not a failing statement (a timeout, a constraint, a missing table), which a new session would repeat."""
    if not isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return False
    code = exc.sqlstate or ""
    return not code or code.startswith("08") or code in _SERVER_GONE


# -- advisory locks ---------------------------------------------------------------------------------
# Keys are 64-bit hashes of a name: 32-bit ``hashtext`` collides often enough (~1 in 77,000 pairs of
# names) to refuse a second slot's or sink's lock for no reason.
LOCK_KEY_SQL = "hashtextextended(%s, 0)"


def try_lock(conn: psycopg.Connection, name: str) -> bool:
    """Take the session-level advisory lock ``name`` if free; held until unlock or the session ends."""
    row = conn.execute(f"SELECT pg_try_advisory_lock({LOCK_KEY_SQL})", (name,)).fetchone()
    return bool(row and row[0])


def lock_within(conn: psycopg.Connection, name: str, seconds: float) -> bool:
    """Take the advisory lock ``name``, retrying for up to ``seconds``: a holder that just went away (same
    process or a restarted one) releases it only once the server has processed its disconnect."""
    deadline = time.monotonic() + seconds
    while not try_lock(conn, name):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def wait_lock(conn: psycopg.Connection, name: str, seconds: float) -> bool:
    """Take the session-level advisory lock ``name``, waiting up to ``seconds`` in the server's lock queue
    (waiters are served in arrival order, and show in pg_locks as not granted). ``conn`` must not be in
    autocommit mode and must have nothing uncommitted: the wait is its own transaction."""
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, int(seconds * 1000))}ms",))
    try:
        conn.execute(f"SELECT pg_advisory_lock({LOCK_KEY_SQL})", (name,))
    except psycopg.errors.LockNotAvailable:
        conn.rollback()
        return False
    conn.commit()
    return True


def unlock(conn: psycopg.Connection, name: str) -> None:
    conn.execute(f"SELECT pg_advisory_unlock({LOCK_KEY_SQL})", (name,))


def lock_held_sql(key: sql.Composable) -> sql.Composed:
    """SQL true while some session of this database holds the session-level advisory lock whose bigint key
    the expression ``key`` computes."""
    return sql.SQL(
        "EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND ((l.classid::bigint << 32) | l.objid::bigint) = {})").format(key)


def lock_holder_sql() -> sql.Composed:
    """SQL (one %s: the name) true while some session of this database holds the lock ``name``."""
    return lock_held_sql(sql.SQL(LOCK_KEY_SQL))


# -- pools ------------------------------------------------------------------------------------------
def pool(dsn: str, *, min_size: int = 1, max_size: int = 4, name: str | None = None, autocommit: bool = False,
         **options: Any) -> Any:
    """A psycopg-pool ConnectionPool with our session settings; connections are checked before use,
    so one that died with a server restart is replaced instead of handed out."""
    from psycopg_pool import ConnectionPool

    return ConnectionPool(conninfo(dsn, **options), min_size=min_size, max_size=max_size, name=name, open=True,
                          kwargs={"autocommit": autocommit}, check=ConnectionPool.check_connection)
