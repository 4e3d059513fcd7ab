"""Several deliverers in one process, each in its own thread: `deliver` without `--sink` keeps every sink
caught up at once (they share the process's lazily started Spark session). One stop stops them all; the
first one to fail stops the others and its error is the run's."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

log = logging.getLogger(__name__)

R = TypeVar("R")
T = TypeVar("T", bound="Runner")


class Runner(Protocol):
    def stop(self) -> None: ...


class Abandoned(Exception):
    """Stopped while the runners still running can be left behind (see ``run_together``)."""


def run_together(runners: Sequence[T], run: Callable[[T], R], names: Sequence[str],
                 stopping: threading.Event | None = None, abandon: Callable[[int], bool] | None = None) -> list[R]:
    """``run(runner)`` for every runner at once; their results in order once all have ended. The calling
    (main) thread only waits, so signal handlers keep running in it. Once ``stopping`` is set, raises
    Abandoned as soon as ``abandon(n)`` says the n still running have nothing in flight (for example all
    wait for the Spark JVM to start, which no stop interrupts)."""
    results: list[R | None] = [None] * len(runners)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            results[i] = run(runners[i])
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            log.error("deliver: sink %s failed: %s: %s; stopping the others", names[i], type(exc).__name__, exc)
            errors.append(exc)
            for other in runners:
                other.stop()

    threads = [threading.Thread(target=one, args=(i,), name=f"deliver-{names[i]}", daemon=True)
               for i in range(len(runners))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)
            left = [n for n, th in zip(names, threads, strict=True) if th.is_alive()]
            if stopping is not None and abandon is not None and stopping.is_set() and left and abandon(len(left)):
                raise Abandoned(", ".join(left))
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]
