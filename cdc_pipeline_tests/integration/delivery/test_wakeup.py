"""A long-running `drain` and `deliver` move a change as soon as it commits, not on their timers: the drain
commits its batch when the stream is quiet (not after `batch_ms`), and tells deliverers of the new rows
(LISTEN/NOTIFY), which do not wait for their `idle_seconds` poll. Idle, neither spends CPU on it."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import psutil
import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import assert_mirrored, mirror_config, wait_until
from cdc_pipeline_tests.processes import spawn, stop

# Timers far longer than the wait below: a change that arrives within it was not moved by one of them.
TIMER_S = 120
WAIT_S = 30  # a change in the mirror within this (~0.1 s on an idle machine)
IDLE_WINDOW_S = 4.0
IDLE_CPU_S = 0.4  # CPU seconds a process may spend in the window (a loop that spins takes ~all of it)


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def _mirrored(dest: psycopg.Connection, id_: int) -> bool:
    if not dest.execute("SELECT to_regclass('mirror.t') IS NOT NULL").fetchone()[0]:
        return False
    return bool(dest.execute("SELECT EXISTS (SELECT FROM mirror.t WHERE id = %s)", (id_,)).fetchone()[0])


def test_a_change_reaches_the_mirror_at_once_and_idle_costs_no_cpu(
        source_db: Database, db_factory: Callable[[], Database],
        write_config: Callable[..., PipelineConfig]) -> None:
    dest = db_factory()
    source_db.execute("CREATE TABLE public.t (id integer PRIMARY KEY, v text NOT NULL)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    data["drain"] = {"heartbeat_seconds": TIMER_S, "batch_ms": TIMER_S * 1000}
    data["delivery"] = {"idle_seconds": TIMER_S}
    config = write_config(data)
    setup(config)
    deliver = spawn(config.path, "deliver", "--sink", "mirror")
    drain = spawn(config.path, "drain")
    watch = psycopg.connect(dest.dsn, autocommit=True)
    try:
        source_db.execute("INSERT INTO public.t VALUES (1, 'v')")
        wait_until(lambda: _mirrored(watch, 1), 120, "the first row in the mirror (start-up)")
        for proc in (deliver, drain):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
        procs = {"deliver": psutil.Process(deliver.pid), "drain": psutil.Process(drain.pid)}
        before = {name: _cpu(p) for name, p in procs.items()}
        time.sleep(IDLE_WINDOW_S)  # a measuring window (not a wait for a condition); both are idle after it
        spent = {name: _cpu(p) - before[name] for name, p in procs.items()}
        print(f"idle CPU over {IDLE_WINDOW_S:.0f} s: " + ", ".join(f"{k} {v:.3f} s" for k, v in spent.items()))
        for name, seconds in spent.items():
            assert seconds < IDLE_CPU_S, f"{name} spent {seconds:.2f} CPU seconds idle in {IDLE_WINDOW_S:.0f} s"
        # The deliverer is now in its idle_seconds wait, the drain in its batch_ms one.
        source_db.execute("INSERT INTO public.t VALUES (2, 'v')")
        started = time.monotonic()
        wait_until(lambda: _mirrored(watch, 2), WAIT_S, "the second row in the mirror before any timer")
        print(f"row 2: in the mirror {time.monotonic() - started:.3f} s after its commit")
        for proc in (deliver, drain):
            code, _, err = stop(proc, signal.SIGTERM, 60)
            assert code == 0, err[-3000:]
    finally:
        watch.close()
        for proc in (deliver, drain):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t")
