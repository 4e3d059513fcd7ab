"""The console script's exit: skip CPython's finalization when nothing is left for it to do.

When a verb has returned, it has closed what it opened (connections, files, sinks, child processes), and
the atexit handlers (logging's flush, weakref finalizers, multiprocessing, Spark's stop) run here as they
would. What is left is the interpreter tearing down pyarrow, numpy and psycopg module by module: 0.1-0.15 s
of every command, a tenth of a short `deliver --until-idle`, for nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Exit with ``code`` after the atexit handlers, without the interpreter's finalization; a normal
    exit when a thread that is not a daemon still runs (a normal exit waits for it)."""
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing more to say on it
            stream.flush()
    os._exit(code)
