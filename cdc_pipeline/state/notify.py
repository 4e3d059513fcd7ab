"""New rows in the change log, told to deliverers: LISTEN/NOTIFY on the state database.

The drain sends a notification in the same transaction as its log rows (capture/logwriter.py), so it is
delivered exactly when they become visible, and never for rows rolled back. A deliverer that caught up
waits on :class:`LogWatch` instead of sleeping: it reads again as soon as the drain commits, and at the
latest after ``delivery.idle_seconds`` (the poll that stays for anything that writes the log without
notifying, and for a state connection through a pooler that drops LISTEN). Notifications are a wake-up
only: what to deliver is always read from the log, so a lost or extra one changes nothing but latency.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psycopg
from psycopg import sql

from cdc_pipeline.postgres import session

log = logging.getLogger(__name__)

# A waiting deliverer looks at its stop flag this often (a stop from a signal handler cannot interrupt
# the wait on the socket); the same as the poll of an idle log before notifications.
STOP_CHECK_SECONDS = 0.25
# After the listening session was lost or refused, a new one is tried no more often than this.
RETRY_SECONDS = 30.0


def channel(schema: str) -> sql.Identifier:
    """The channel of a state schema's change log (PostgreSQL truncates a long name the same way on both ends)."""
    return sql.Identifier(f"{schema}_log")


def announce(conn: psycopg.Connection, schema: str) -> None:
    """Queue the notification in ``conn``'s open transaction: sent when (and only if) it commits."""
    conn.execute(sql.SQL("NOTIFY {}").format(channel(schema)))


class LogWatch:
    """A deliverer's wait for new log rows on its own listening session (opened before the first read of
    the log, so a commit between that read and the wait still wakes it)."""

    def __init__(self, dsn: str, schema: str, stop: threading.Event, application_name: str | None = None) -> None:
        self._dsn, self._schema, self._stop, self._name = dsn, schema, stop, application_name
        self._conn: psycopg.Connection | None = None
        self._retry_at = 0.0
        self.wakeups = 0  # waits ended by a notification (tests, stats)
        self._listen()

    def wait(self, seconds: float) -> bool:
        """Until the drain commits new rows, ``seconds`` pass or the stop flag is set; True when notified."""
        deadline = time.monotonic() + seconds
        if self._conn is None and time.monotonic() >= self._retry_at:
            self._listen()
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._conn is None:
                self._stop.wait(remaining)
                return False
            got = False
            try:
                for _ in self._conn.notifies(timeout=min(remaining, STOP_CHECK_SECONDS), stop_after=1):
                    got = True
            except psycopg.Error as exc:
                self._lost(exc)
                continue
            if got:  # (all received in one read: those queued while delivering do not wake it again)
                self.wakeups += 1
                return True
        return False

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with suppress(psycopg.Error):
                conn.close()

    def _listen(self) -> None:
        try:
            self._conn = session.connect(self._dsn, autocommit=True, application_name=self._name)
            self._conn.execute(sql.SQL("LISTEN {}").format(channel(self._schema)))
        except psycopg.Error as exc:
            self._lost(exc)

    def _lost(self, exc: psycopg.Error) -> None:
        log.warning("delivery: not notified of new log rows (%s); polling every delivery.idle_seconds until a "
                    "listening session opens again", type(exc).__name__)
        self.close()
        self._retry_at = time.monotonic() + RETRY_SECONDS


class Sleep:
    """The wait of a one-off catch-up (`--until-idle`), which needs no listening session."""

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop

    def wait(self, seconds: float) -> bool:
        self._stop.wait(seconds)
        return False


@contextmanager
def watching(dsn: str, schema: str, stop: threading.Event, listen: bool,
             application_name: str | None = None) -> Iterator[LogWatch | Sleep]:
    """A :class:`LogWatch` for a long-running delivery (``listen``), else a plain :class:`Sleep`."""
    if not listen:
        yield Sleep(stop)
        return
    watch = LogWatch(dsn, schema, stop, application_name)
    try:
        yield watch
    finally:
        watch.close()
