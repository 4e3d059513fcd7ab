"""Stopping a long-running command: the first SIGTERM, SIGINT or SIGHUP asks everything registered to stop
cleanly (the command then exits 0); a second one forces it: the process's descendants (a Spark JVM, `dagster
dev` and what it started) are killed and the process exits with 128 + the signal's number.

Handlers are installed as the verb starts, before anything slow (config, connections, a JVM), so a signal
during start-up is a clean stop too, never a death by the signal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Shutdown:
    def __init__(self) -> None:
        self.requested = threading.Event()
        self.signum: int | None = None
        self._callbacks: list[Callable[[], object]] = []
        self._on_force: list[Callable[[], object]] = []
        self._lock = threading.Lock()
        self._previous: dict[int, object] = {}  # the handling before install(): release() restores it

    def install(self) -> Shutdown:
        """Take over SIGTERM, SIGINT and SIGHUP (main thread only); also when the shell started us with
        SIGINT ignored (a background job), which would leave only SIGTERM to stop us."""
        for signum in SIGNALS:
            previous = signal.signal(signum, self._handle)
            if previous != self._handle:  # type: ignore[comparison-overlap]
                self._previous[signum] = previous
        return self

    def release(self) -> None:
        """Give the signals their previous handling back (a short verb, which a signal ends as before); one
        that came already is raised again under it."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if self.signum is not None:
            signal.raise_signal(self.signum)

    def on_stop(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` on the first signal; at once if it came already."""
        with self._lock:
            self._callbacks.append(callback)
            late = self.requested.is_set()
        if late:
            callback()

    def on_force(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (quick: it delays the forced exit) on a second signal, for what is not our
        descendant and would outlive us (a daemonized embedded PostgreSQL)."""
        self._on_force.append(callback)

    def request(self, signum: int | None = None) -> None:
        """A clean stop, as the first signal asks it (also for a `--seconds` limit)."""
        with self._lock:
            self.signum = self.signum or signum
            self.requested.set()
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one stop failing must not keep the others from stopping
                log.exception("stopping: a stop callback failed")

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested.is_set():
            for callback in self._on_force:
                with contextlib.suppress(Exception):
                    callback()
            force_exit(signum)
        log.warning("%s: stopping cleanly (send it again to force)", signal.Signals(signum).name)
        self.request(signum)


def kill_descendants(sig: int = signal.SIGKILL) -> None:
    """Every process this one started, directly or not (best effort: some may be gone already)."""
    import psutil  # here, not at the top: ~10 ms of every command's start-up, for a forced stop only

    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.send_signal(sig)


def force_exit(signum: int) -> None:
    try:
        kill_descendants()
    finally:  # exit whatever happened on the way (the forced stop must not hang on a failed clean-up)
        os._exit(128 + signum)


shutdown = Shutdown()  # one per process: signal handlers are process-wide
