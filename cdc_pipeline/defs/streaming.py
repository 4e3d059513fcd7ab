"""Long-lived Dagster steps: the drain or a delivery runs in a worker thread while the step's own
(main) thread reads its figures every few seconds (and records those that mean something), and stops the work cleanly when Dagster
interrupts the run.

Why a worker thread: Dagster only publishes the events a step yields, and raises its termination
(DagsterExecutionInterruptedError, from SIGINT/SIGTERM sent to the run worker) in the main thread.
The main thread waits on the worker in short waits, so it both yields events while the work streams
and sees the interrupt at once; it then calls the work's `stop()` and waits for it to finish its
batch, so the drain acknowledges the slot and delivery commits the sink's offset before the run ends.

These steps have no RetryPolicy on purpose: Dagster turns an interrupt into a retry when a step has
one, so Terminate would restart the step instead of ending the run. Transient faults are ridden
through inside the drain and the engine; a run that fails anyway is restarted by its sensor, with
backoff.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from cdc_pipeline.config.errors import RedactedError, describe_error, without_secrets

T = TypeVar("T")

EVENT_SECONDS = 5.0  # how often a streaming run reads its figures (what it records: defs/pacing.py)
STOP_TIMEOUT_SECONDS = 60.0  # a batch in flight finishes (and commits) within this


class Worker(threading.Thread):
    """Waited on through `done`, not `join()`: a signal that interrupts `join()` can leave the thread
    marked stopped while it still runs (bpo-45274), and the interrupt is exactly what we wait through."""

    def __init__(self, name: str, work: Callable[[], Any]) -> None:
        super().__init__(name=name, daemon=True)
        self.work = work
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.value = self.work()
        except BaseException as exc:  # handed to the step's thread, which raises it
            self.error = exc
        finally:
            self.done.set()


def stream_while(name: str, work: Callable[[], T], stop: Callable[[], None],
                 poll: Callable[[], Iterable[Any]], every: float,
                 on_poll_error: Callable[[Exception], None],
                 on_stopped: Callable[[Any], None] | None = None) -> Iterator[Any]:
    """Runs `work` in a thread; every `every` seconds yields what `poll` returns. Returns `work`'s
    value (use `value = yield from stream_while(...)`) or raises its error. An interrupt (or the
    generator being closed) stops the work, waits for it, and hands what it returned to `on_stopped`
    before propagating."""
    worker = Worker(name, work)

    def stop_and_wait() -> None:
        stop()
        worker.done.wait(STOP_TIMEOUT_SECONDS)

    atexit.register(stop_and_wait)  # the run worker exiting some other way still stops cleanly
    worker.start()
    try:
        next_poll = time.monotonic() + every
        while not worker.done.is_set():
            worker.done.wait(max(0.0, min(0.5, next_poll - time.monotonic())))
            if not worker.done.is_set() and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + every
                try:
                    events = list(poll())
                except Exception as exc:  # figures are best effort; the work goes on
                    on_poll_error(RedactedError(describe_error(exc)))
                    events = []
                yield from events
    except BaseException:
        stop_and_wait()
        if on_stopped is not None and worker.done.is_set():
            on_stopped(worker.error or worker.value)
        raise
    finally:
        atexit.unregister(stop_and_wait)
    if worker.error is not None:
        error = without_secrets(worker.error)
        if error is worker.error:
            raise error
        raise error from None  # Dagster stores and shows the message and its causes: never a secret
    return worker.value  # type: ignore[no-any-return]
