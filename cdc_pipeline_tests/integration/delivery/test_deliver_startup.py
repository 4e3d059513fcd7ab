"""`deliver` as a process: a sink without Spark work starts without a JVM and delivers at once; a signal
during start-up (the JVM of a sink that needs Spark) is a clean stop; without --sink every sink is delivered
at once and one signal stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import assert_mirrored, drain, mirror_config, wait_until
from cdc_pipeline_tests.processes import assert_none_left, descendants, java_among, spawn, stop

DDL = "CREATE TABLE public.t (id integer PRIMARY KEY, v text NOT NULL)"
FIRST_ROW_LIMIT_S = 2.0  # process start to first row in the mirror, no JVM (issue 25)


def _count(dsn: str, table: str) -> int:
    try:
        with psycopg.connect(dsn) as conn:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # noqa: S608 - test's own name
    except psycopg.errors.UndefinedTable:
        return 0


def _exists(conn: psycopg.Connection) -> bool:
    return bool(conn.execute("SELECT to_regclass('mirror.t') IS NOT NULL").fetchone()[0])


def _config(source_db: Database, dest: Database, write_config: Callable[..., PipelineConfig],
            rows: int, **sink: Any) -> PipelineConfig:
    source_db.execute(DDL)
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"], **sink)
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, %s) g", (rows,))
    drain(config)
    return config


def test_mirror_deliver_starts_without_a_jvm_and_delivers_at_once(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig]) -> None:
    dest = db_factory()
    config = _config(source_db, dest, write_config, rows=500)
    watch = psycopg.connect(dest.dsn, autocommit=True)  # one connection: polling must not load the machine
    started = time.monotonic()
    proc = spawn(config.path, "deliver", "--sink", "mirror")
    try:
        while not watch.execute("SELECT to_regclass('mirror.t') IS NOT NULL AND EXISTS (SELECT FROM mirror.t)"
                                if _exists(watch) else "SELECT false").fetchone()[0]:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() - started < 60, "no row delivered in 60 s"
            time.sleep(0.01)
        first_row = time.monotonic() - started
        print(f"first row in the mirror {first_row:.2f} s after process start")
        wait_until(lambda: _count(dest.dsn, "mirror.t") == 500, 60, "every row in the mirror")
        assert java_among(proc.pid) == [], "a JVM was started for a sink without Spark work"
        code, out, err = stop(proc, signal.SIGTERM, 30)
    finally:
        watch.close()
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err
    assert "sink mirror:" in out
    # 2 s on an idle machine; on a shared, loaded one the bound grows with the load per core.
    limit = FIRST_ROW_LIMIT_S * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    assert first_row < limit, f"first row after {first_row:.2f} s (limit {limit:.1f} s)"
    assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t")


# The CLI's main, with a report at exit of whether pandas was ever imported.
_REPORTING_PANDAS = ("import atexit, sys\n"
                     "atexit.register(lambda: print('pandas imported:', 'pandas' in sys.modules, file=sys.stderr))\n"
                     "from cdc_pipeline.cli import main\n"
                     "sys.argv = ['cdc-pipeline', *sys.argv[1:]]\n"
                     "main()\n")


def test_a_deliver_without_spark_work_never_imports_pandas_and_mirrors_every_type(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig]) -> None:
    """pyarrow is told there is no pandas (delivery/pandas_free.py); the values that go through pyarrow's
    Python conversions (timestamps with a zone, numerics, JSON, text with quotes and newlines) still arrive."""
    dest = db_factory()
    source_db.execute("CREATE TABLE public.odd (id text PRIMARY KEY, v jsonb, n numeric, t timestamptz, d date, "
                      "a int[], b bytea)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.odd"]))
    setup(config)
    source_db.execute("INSERT INTO odd VALUES (%s, %s, 1.50, '2026-01-02 03:04:05+05', '2026-01-02', '{1,NULL}', "
                      "'\\x00ff'), ('b', NULL, NULL, NULL, NULL, NULL, NULL)", ('é"\\|\n', '{"x": [1, null]}'))
    source_db.execute("UPDATE odd SET n = 2, t = 'infinity' WHERE id = 'b'")
    drain(config)
    done = subprocess.run([sys.executable, "-c", _REPORTING_PANDAS, "--config", config.path, "deliver", "--sink",
                           "mirror", "--until-idle"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "pandas imported: False" in done.stderr
    assert_mirrored(source_db.dsn, "public.odd", dest.dsn, "mirror.odd")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_while_spark_starts_is_a_clean_stop(
        signum: signal.Signals, source_db: Database, db_factory: Callable[[], Database],
        write_config: Callable[..., PipelineConfig]) -> None:
    dest = db_factory()
    config = _config(source_db, dest, write_config, rows=50, filter="record.v <> 'v1'")  # needs Spark
    proc = spawn(config.path, "deliver", "--sink", "mirror")
    try:
        wait_until(lambda: java_among(proc.pid) or proc.poll() is not None, 60, "the Spark JVM to start")
        started = descendants(proc.pid)
        code, _, err = stop(proc, signum, 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, f"exit {code} after {signum.name}:\n{err[-2000:]}"
    assert_none_left(started)


def test_deliver_without_sink_keeps_every_sink_caught_up(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig]) -> None:
    dest = db_factory()
    source_db.execute(DDL)
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    second = dict(data["sinks"][0], name="b")
    second["destination"] = dict(second["destination"], table="mirror_b.{table}")
    data["sinks"] = [dict(data["sinks"][0], name="a"), second]
    config = write_config(data)
    setup(config)
    stop_load = threading.Event()
    written = [0]

    def load() -> None:  # a steady load: inserts and updates, ~100 changes/s
        with psycopg.connect(source_db.dsn, autocommit=True) as conn:
            while not stop_load.wait(0.01):
                written[0] += 1
                conn.execute("INSERT INTO public.t VALUES (%s, 'x') ON CONFLICT (id) DO UPDATE SET v = 'y'",
                             (written[0] % 400,))

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    drainer = spawn(config.path, "drain")
    deliverer = spawn(config.path, "deliver")
    try:
        # Both sinks follow the load while it runs (not one after the other).
        wait_until(lambda: deliverer.poll() is not None or (
            _count(dest.dsn, "mirror.t") >= 200 and _count(dest.dsn, "mirror_b.t") >= 200), 120,
            "both mirrors to follow the load")
        assert deliverer.poll() is None, "deliver ended"
        assert java_among(deliverer.pid) == []
        stop_load.set()
        loader.join()
        want = int(source_db.execute("SELECT count(*) FROM public.t")[0][0])
        wait_until(lambda: _count(dest.dsn, "mirror.t") == want and _count(dest.dsn, "mirror_b.t") == want
                   and _same(source_db, dest), 120, "both mirrors to catch up")
        code, out, err = stop(deliverer, signal.SIGTERM, 60)  # one signal stops both sinks
        assert code == 0, err
        assert "sink a:" in out and "sink b:" in out
        assert stop(drainer, signal.SIGTERM, 60)[0] == 0
    finally:
        stop_load.set()
        for proc in (drainer, deliverer):
            if proc.poll() is None:
                proc.kill()
                print(proc.args[-1], proc.communicate()[1][-3000:])
    assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t")
    assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror_b.t")


def _same(source_db: Database, dest: Database) -> bool:
    src = source_db.execute("SELECT id, v FROM public.t ORDER BY id")
    with psycopg.connect(dest.dsn) as conn:
        return all(conn.execute(f"SELECT id, v FROM {t} ORDER BY id").fetchall() == src  # noqa: S608
                   for t in ("mirror.t", "mirror_b.t"))
