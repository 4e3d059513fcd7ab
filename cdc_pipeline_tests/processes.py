"""Real processes for the operations tests: start the CLI, watch what it started (psutil), signal it, and
check that nothing it started is left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from cdc_pipeline_tests.helpers import wait_until

CLI = str(Path(sys.executable).with_name("cdc-pipeline"))


def spawn(config_path: str | None, *args: str, env: dict[str, str] | None = None,
          ignore_sigint: bool = False) -> subprocess.Popen[str]:
    """The CLI in its own session, SIGINT ignored if asked (what a background job of a non-interactive
    shell inherits)."""
    def preexec() -> None:
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.SIG_DFL)

    cmd = [CLI, *(["--config", config_path] if config_path else []), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, preexec_fn=preexec)


def descendants(pid: int) -> dict[int, str]:
    """pid -> name of every live process started by ``pid``, directly or not."""
    found: dict[int, str] = {}
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                found[child.pid] = child.name()
    return found


def java_among(pid: int) -> list[int]:
    return [p for p, name in descendants(pid).items() if name == "java"]


def alive(pids: dict[int, str]) -> dict[int, str]:
    """The ones still running (a zombie is gone; a reused pid with another name is not ours)."""
    left: dict[int, str] = {}
    for pid, name in pids.items():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and proc.name() == name:
                left[pid] = name
    return left


def stop(proc: subprocess.Popen[str], signum: int, timeout: float) -> tuple[int, str, str]:
    """Send ``signum``; returns the exit code and output once it has exited (fails after ``timeout``)."""
    proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"still running {timeout:.0f} s after {signal.Signals(signum).name}:\n{err[-3000:]}") \
            from exc
    return proc.returncode, out, err


def assert_none_left(started: dict[int, str], timeout: float = 30.0) -> None:
    wait_until(lambda: not alive(started), timeout, f"processes it started to exit: {alive(started)}")
