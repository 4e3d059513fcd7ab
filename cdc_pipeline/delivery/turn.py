"""The sink's send lock, taken in turns. A replay holds it for its whole run (delivery/replay.py), so its old
versions never land between live ones; a delivery holds it while calls are out and lets it go between windows
(a replay's turn). A dry run sends nothing and takes no lock."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psycopg

from cdc_pipeline.postgres import session

log = logging.getLogger("cdc_pipeline.delivery.engine")  # the delivery's own log, as its other parts

TURN_WAIT_SECONDS = 1.0  # a send waiting for a replay looks at its stop event this often


class SendTurn:
    def __init__(self, conn: psycopg.Connection, lock: str, name: str, stop: threading.Event,
                 locking: bool = True) -> None:
        self._conn = conn  # the state connection: the lock is its session's
        self._lock = lock
        self._name = name  # for messages
        self._stop = stop
        self._locking = locking
        self.held = False

    def take(self) -> bool:
        """Hold the lock (at once if it is held already). False: stopped while a replay held it."""
        if self.held:
            return True
        waited = False
        while self._locking and not session.wait_lock(self._conn, self._lock, TURN_WAIT_SECONDS):
            if self._stop.is_set():
                return False
            if not waited:
                log.info("sink %s: waiting for a replay of this sink to finish", self._name)
                waited = True
        self.held = True
        return True

    def give(self) -> None:
        """Let it go (a replay may take its turn), if it is held."""
        if not self.held:
            return
        self.held = False
        if not self._locking:
            return
        if self._conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
            self._conn.rollback()
        session.unlock(self._conn, self._lock)
        self._conn.commit()

    @contextmanager
    def around(self) -> Iterator[bool]:
        """A turn of its own for one step, let go after it (on an error too). False: stopped while a replay
        held the lock."""
        self.give()
        if not self.take():
            yield False
            return
        try:
            yield True
        except BaseException:
            with suppress(psycopg.Error):  # the step's own error is the one to report
                self.give()
            raise
        self.give()
