"""The drain's memory does not grow with the size of a source transaction.

A 100,000-row and then a 1,000,000-row transaction are drained by the real `cdc-pipeline drain`
process; its peak RSS must stay far below 1 GB and must not grow with the transaction: the 10x larger
transaction may not cost much more than the smaller one. The million rows are the point and stay: a drain
holding the transaction's changes as Python objects (some 300+ bytes each) would add 300+ MB at 1M rows,
well past both bounds, where a smaller transaction's growth could hide inside the +50% / +20 MB slack.

Peak RSS is the kernel's high-water mark VmHWM from /proc/PID/status, read until the process exits.
(Not ru_maxrss: a child forked from this big pytest process inherits its RSS until exec, and ru_maxrss
keeps that; VmHWM belongs to the exec'd image only.)
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, mirror_config

CLI = str(Path(sys.executable).with_name("cdc-pipeline"))
MB = 1024 * 1024


def _hwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return None  # exited (a zombie has no memory map)


def drain_peak_rss(config: PipelineConfig, tmp: Path) -> tuple[int, int, str]:
    """Run `drain --until-idle` to completion; return (peak RSS by VmHWM, peak RSS by polling, stdout)."""
    assert config.path
    out, err = tmp / "drain.out", tmp / "drain.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([CLI, "--config", config.path, "drain", "--until-idle", "--seconds", "300"],
                                stdout=o, stderr=e)
    hwm = polled = 0
    ps = psutil.Process(proc.pid)
    while proc.poll() is None:
        got = _hwm(proc.pid)
        hwm = max(hwm, got or 0)
        with contextlib.suppress(psutil.NoSuchProcess):
            polled = max(polled, ps.memory_info().rss)
        time.sleep(0.01)
    assert proc.returncode == 0, f"drain failed: {err.read_text()}"
    return hwm, polled, out.read_text().strip()


def log_count(config: PipelineConfig, where: str = "true") -> int:
    import psycopg

    with psycopg.connect(config.state_dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM cdc_pipeline.change_log WHERE {where}").fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.slow
def test_million_row_transaction_bounded_memory(source_db: Database, db_factory: Callable[[], Database],
                                                write_config: Callable[..., PipelineConfig], spark: Any,
                                                tmp_path: Path) -> None:
    dest = db_factory()
    source_db.execute("CREATE TABLE big (id integer PRIMARY KEY, v integer, s text)")
    # Delivery (after the drain's measurements, in this process) in 100k batches: fewer batches, same rows.
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.big"], batch_size=100_000))
    setup(config)

    source_db.execute("INSERT INTO big SELECT g, g % 1000, 'r' || g FROM generate_series(1, 100000) g")
    small, small_polled, out = drain_peak_rss(config, tmp_path)
    print(f"100k-row transaction: peak RSS {small / MB:.0f} MB (polled {small_polled / MB:.0f} MB); {out}")
    assert log_count(config) == 100_000

    started = time.monotonic()
    source_db.execute("INSERT INTO big SELECT g, g % 1000, 'r' || g FROM generate_series(100001, 1100000) g")
    big, big_polled, out = drain_peak_rss(config, tmp_path)
    print(f"1M-row transaction: peak RSS {big / MB:.0f} MB (polled {big_polled / MB:.0f} MB); {out}; "
          f"{time.monotonic() - started:.1f} s with the insert")
    # Exactly the transaction's rows, once, in one transaction.
    assert log_count(config, "xid = (SELECT max(xid) FROM cdc_pipeline.change_log)") == 1_000_000
    assert log_count(config) == 1_100_000

    assert big < 300 * MB, f"drain peak RSS {big / MB:.0f} MB for a 1M-row transaction"
    # Not proportional to the transaction: 10x the rows may cost at most +50% (+20 MB slack).
    assert big < small * 1.5 + 20 * MB, f"peak RSS grew from {small / MB:.0f} MB to {big / MB:.0f} MB"

    started = time.monotonic()
    stats = deliver(config, spark)
    print(f"delivered {stats.delivered} in {time.monotonic() - started:.1f} s ({stats.rate:.0f}/s)")
    assert stats.delivered == 1_100_000
    assert assert_mirrored(source_db.dsn, "public.big", dest.dsn, "mirror.big") == 1_100_000
