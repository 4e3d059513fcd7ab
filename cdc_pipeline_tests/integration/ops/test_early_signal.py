"""A signal in a long-running verb's first moments, while Python is still importing the command line, is a
clean stop (exit 0), not a death by the signal (143/130/129): the console script sets the handlers before
any heavy import (cdc_pipeline/console.py). Observed through /proc: the moment the process catches the
signal, pydantic (which every verb's config needs) is not loaded yet; the signal is sent right then."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.helpers import mirror_config
from cdc_pipeline_tests.processes import spawn, stop


def _catches(pid: int, signum: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _loaded(pid: int, library: str) -> bool:
    return library in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
@pytest.mark.parametrize("verb", ["drain", "deliver"])
def test_a_signal_during_the_imports_is_a_clean_stop(verb, signum, source_db, db_factory, write_config, tmp_path):
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(mirror_config(source_db.dsn, db_factory().dsn, ["public.t"]))
    setup(config)
    proc = spawn(str(tmp_path / "cdc.yaml"), verb)
    try:
        deadline = time.monotonic() + 30
        # The first moment our handlers are set (polled without a pause): SIGTERM's, since Python's own
        # start-up already catches SIGINT (KeyboardInterrupt) before any of our code runs.
        while not _catches(proc.pid, signal.SIGTERM):
            assert proc.poll() is None and time.monotonic() < deadline, "never handled the signal"
        assert not _loaded(proc.pid, "pydantic_core"), "the handlers were set only after the heavy imports"
        code, _out, err = stop(proc, signum, timeout=60)
    finally:
        if proc.poll() is None:  # a failed assertion must not leave the verb running
            proc.kill()
            proc.wait(30)
    assert code == 0, err[-2000:]
    assert "Traceback" not in err
