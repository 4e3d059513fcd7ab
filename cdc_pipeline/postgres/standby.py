"""A standby as the source (PostgreSQL 16+ decodes on a standby; `source.primary_dsn` names its primary).

Two waits are particular to it: a backfill page may be read on the standby only once the standby has replayed
the page's low watermark (else its snapshot could miss a change the stream places before the watermark), and
creating a logical slot on a standby waits for a running-xacts record from the primary, which the primary
writes every 15 s unless asked (`pg_log_standby_snapshot()`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from cdc_pipeline.postgres import session

log = logging.getLogger(__name__)

MIN_VERSION = 160000  # logical decoding on a standby


def in_recovery(conn: psycopg.Connection) -> bool:
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def wait_replayed(standby: psycopg.Connection, primary: psycopg.Connection, stop: threading.Event | None = None,
                  warn_after_s: float = 30.0) -> bool:
    """Wait until `standby` has replayed everything `primary` had written when called (a watermark just
    committed there). False when `stop` was set first."""
    stop = stop or threading.Event()
    # The insert position: under synchronous_commit = off a commit returns before its record is written.
    row = primary.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    target = row[0]
    started = warned = time.monotonic()
    pause = 0.005
    while True:
        done = standby.execute("SELECT coalesce(pg_last_wal_replay_lsn() >= %s::pg_lsn, true)", (target,)).fetchone()
        if done and done[0]:
            return True
        if stop.wait(pause):
            return False
        pause = min(pause * 2, 0.1)
        if time.monotonic() - warned >= warn_after_s:
            warned = time.monotonic()
            log.warning("waiting %.0f s for the standby to replay the primary's WAL up to %s (replication lag)",
                        warned - started, target)


@contextmanager
def snapshots_logged(primary_dsn: str, every_s: float = 0.2) -> Iterator[None]:
    """While the body runs (creating a logical slot on a standby), the primary logs a running-xacts record
    every `every_s`, so the slot's creation does not wait up to 15 s for the next one."""
    done = threading.Event()

    def nudge() -> None:
        try:
            with session.connect(primary_dsn, autocommit=True, application_name="cdc_pipeline.setup") as conn:
                while True:
                    conn.execute("SELECT pg_log_standby_snapshot()")
                    if done.wait(every_s):
                        return
        except psycopg.Error as exc:  # only a speed-up: the creation still completes without it
            log.warning("could not ask the primary for running-xacts records: %s", type(exc).__name__)

    thread = threading.Thread(target=nudge, name="standby-snapshots", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(10)
