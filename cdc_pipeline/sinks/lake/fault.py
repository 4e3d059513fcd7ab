"""A test's fault hook: `CDC_LAKE_FAULT=<step>:<n>` SIGKILLs this process the n-th time a lake sink reaches
`step` (`before_commit`: a table's data about to be committed; `after_commit`: committed, the engine's offset
not yet). Unset (always, outside the crash tests): nothing. A SIGKILL at an exact step cannot be had otherwise."""

from __future__ import annotations

import os
import signal
import threading

ENV = "CDC_LAKE_FAULT"
_seen: dict[str, int] = {}
_lock = threading.Lock()


def reached(step: str) -> None:
    plan = os.environ.get(ENV)
    if not plan:
        return
    name, _, count = plan.partition(":")
    if name != step:
        return
    with _lock:
        _seen[step] = _seen.get(step, 0) + 1
        if _seen[step] >= int(count or 1):
            os.kill(os.getpid(), signal.SIGKILL)
