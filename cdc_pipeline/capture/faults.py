"""Which drain failures heal by themselves (retry with backoff) and which need a person (exit non-zero).

Permanent: the slot is gone or invalidated, the publication is gone, authentication or authorization is
refused, the state schema is missing, another process holds the slot at start. Transient: every lost or
refused connection, server shutdowns and restarts, timeouts, lock and serialization conflicts. Anything
else (a bug, bad data) is neither: it propagates unchanged.
"""

from __future__ import annotations

import psycopg

from cdc_pipeline.postgres.replication import ReplicationError


class DrainFatal(RuntimeError):
    """A failure retrying cannot fix; the message says what to do."""


class LockStillHeld(RuntimeError):
    """After a reconnect, the drain's lock is still held: by our own old session until the server times
    it out (TCP keepalives), so it is waited for."""


# SQLSTATE classes that mean "try again later": connection exception, insufficient resources,
# operator intervention (shutdown, cancel, statement timeout), system error, transaction rollback.
_TRANSIENT_CLASSES = ("08", "53", "57", "58", "40")
_TRANSIENT_CODES = ("55P03", "55006")  # lock_not_available, object_in_use (slot busy after a reconnect)
_AUTH_WORDS = ("password authentication failed", "authentication failed", "no pg_hba.conf entry",
               "role \"", "database \"", "permission denied", "must be superuser or replication role")


# What a retry waits for, by what the session was doing when it failed.
WAITING_FOR = {
    "connecting to the state database": "the state database to accept connections",
    "taking the drain lock": "the state database to end this drain's previous session and its lock",
    "connecting to the source database": "the source database to accept connections",
    "starting replication": "the source to accept a replication connection on the slot",
    "streaming": "the source and state databases (connection lost or ended by the server)",
}


def sqlstate(exc: BaseException) -> str | None:
    if isinstance(exc, ReplicationError):
        return exc.sqlstate
    if isinstance(exc, psycopg.Error):
        return exc.sqlstate
    return None


def permanent(exc: BaseException, slot: str, publication: str, streamed_before: bool) -> str | None:
    """The fix message when ``exc`` is permanent, else None."""
    if isinstance(exc, DrainFatal):
        return str(exc)
    code = sqlstate(exc) or ""
    text = str(exc)
    if code == "42704" or "does not exist" in text and ("replication slot" in text or "publication" in text):
        if "publication" in text:
            return publication_gone(publication)
        return slot_gone(slot)
    if code == "55000" and ("invalidated" in text or "can no longer get changes" in text):
        return slot_lost(slot)
    if code == "55006" and not streamed_before:
        return (f"{text}: another process is consuming replication slot {slot!r}; stop it first (or wait "
                f"for the server to time its connection out) and start the drain again")
    if code.startswith("28") or code in ("3D000", "42501") or (
            isinstance(exc, psycopg.OperationalError) and not code and any(w in text for w in _AUTH_WORDS)):
        return f"{text}: the server refused the connection; fix the credentials or privileges in the DSN"
    if code == "42P01" and "cdc_pipeline" in text or isinstance(exc, psycopg.errors.UndefinedTable):
        return f"{text}: the state schema is missing or incomplete; run `cdc-pipeline setup`"
    return None


def transient(exc: BaseException) -> bool:
    code = sqlstate(exc)
    if code:
        return code[:2] in _TRANSIENT_CLASSES or code in _TRANSIENT_CODES
    return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError, ReplicationError, OSError,
                            LockStillHeld))


def slot_gone(slot: str) -> str:
    return (f"replication slot {slot!r} does not exist (dropped?): the changes since it was dropped cannot be "
            f"read any more. Run `cdc-pipeline setup` to create it again, then backfill every table "
            f"(`cdc-pipeline backfill TABLE`) so the log and sinks catch up")


def slot_lost(slot: str) -> str:
    return (f"replication slot {slot!r} was invalidated (wal_status = 'lost': the server removed WAL it still "
            f"needed, see max_slot_wal_keep_size): drop it (SELECT pg_drop_replication_slot('{slot}')), run "
            f"`cdc-pipeline setup` to create it again, then backfill every table (`cdc-pipeline backfill TABLE`)")


def publication_gone(publication: str) -> str:
    return (f"publication {publication!r} does not exist: run `cdc-pipeline setup` to create it again; if the "
            f"stream still reports it missing, the slot must be recreated (drop it, `setup`) and every table "
            f"backfilled")
