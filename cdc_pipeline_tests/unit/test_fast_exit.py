"""The console script exits without CPython's finalization (cli/fast_exit.py), keeping the exit code,
everything printed and every atexit handler; a thread that is not a daemon is still waited for."""

from __future__ import annotations

import subprocess
import sys

_SCRIPT = ("import atexit, sys, threading, time\n"
           "atexit.register(lambda: print('atexit ran', flush=True))\n"
           "{thread}"
           "sys.argv = ['cdc-pipeline', *sys.argv[1:]]\n"
           "from cdc_pipeline.cli import run\n"
           "run()\n")
# A thread that finishes only once the main thread has ended (CPython marks it stopped as the interpreter's
# shutdown begins): alive when the fast exit looks, whatever the machine's load, so it must be waited for.
_LATE_THREAD = ("def late():\n"
                "    while threading.main_thread().is_alive():\n"
                "        time.sleep(0.01)\n"
                "    print('thread finished', flush=True)\n"
                "threading.Thread(target=late).start()\n")


def _run(*args: str, thread: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _SCRIPT.format(thread=thread), *args],
                          capture_output=True, text=True, timeout=60)


def test_exit_code_output_and_atexit_handlers_survive_the_fast_exit() -> None:
    done = _run("--config", "/nonexistent/cdc.yaml", "status")
    assert done.returncode == 2
    assert "config error: /nonexistent/cdc.yaml: file not found" in done.stderr
    assert done.stdout == "atexit ran\n"
    assert _run("--help").returncode == 0


def test_a_thread_that_is_not_a_daemon_is_waited_for() -> None:
    done = _run("--config", "/nonexistent/cdc.yaml", "status", thread=_LATE_THREAD)
    assert done.returncode == 2
    assert done.stdout == "thread finished\natexit ran\n"
