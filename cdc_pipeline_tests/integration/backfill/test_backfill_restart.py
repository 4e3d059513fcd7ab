"""A running `backfill` process rides through `pg_ctl restart -m fast` of its source (which holds the state
too) with the drain's capped backoff and completes in the same run, no rerun; one that the drain completes
while its session is lost, or after its process died, reports completed: the truth, not a failure."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import embedded
from cdc_pipeline_tests.conftest import Database, _drop
from cdc_pipeline_tests.helpers import wait_until
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill_config
from cdc_pipeline_tests.processes import CLI, spawn, stop


@pytest.fixture(scope="module")
def cluster() -> Iterator[embedded.EmbeddedPostgres]:
    pg = embedded.create()
    pg.start(durable=False)
    try:
        yield pg
    finally:
        pg.destroy()


@pytest.fixture
def rdb(cluster: embedded.EmbeddedPostgres) -> Iterator[Database]:
    name = f"r_{uuid.uuid4().hex[:12]}"
    cluster.create_database(name)
    yield Database(cluster.dsn(), name)
    _drop(cluster.dsn(), name)  # its slot too


def _restart(cluster: embedded.EmbeddedPostgres) -> None:
    cluster._run(str(embedded.PG_BIN / "pg_ctl"), "-D", str(cluster.data_dir), "-l", str(cluster.root / "postgres.log"),
                 "-o", f"-p {cluster.port}", "-m", "fast", "-w", "-t", "60", "restart")


def _config(db: Database, dest: Database, write_config: Callable[..., PipelineConfig], rows: int,
            page: int, **drain: Any) -> PipelineConfig:
    db.execute("CREATE TABLE public.t (id integer PRIMARY KEY, v text NOT NULL)")
    db.execute("INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, %s) g", (rows,))
    data = backfill_config(db.dsn, dest.dsn, ["public.t"], {"initial_page_size": page, "max_page_size": page,
                                                            "max_staged_pages": 8})
    data["source"]["slot"] = f"s_{db.name}"  # one cluster: a slot per database
    config = write_config({**data, "drain": {**data.get("drain", {}), **drain}})
    setup(config)
    return config


def _backfills(db: Database) -> list[tuple[str, str, int]]:
    return [(r[0], r[1], int(r[2])) for r in
            db.execute("SELECT id, status, pages FROM cdc_pipeline.backfills ORDER BY created_at")]


def _reads(db: Database) -> int:
    return int(db.execute("SELECT count(DISTINCT pk) FROM cdc_pipeline.change_log WHERE action = 'read'")[0][0])


def _last_staged(db: Database) -> bool:
    if not db.execute("SELECT to_regclass('cdc_pipeline.backfill_pages')")[0][0]:
        return False
    return bool(db.execute("SELECT coalesce(bool_or(last), false) FROM cdc_pipeline.backfill_pages "
                           "WHERE status = 'staged'")[0][0])


def _kill(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            print(proc.communicate()[1][-3000:])


def _up(db: Database) -> bool:
    try:
        db.execute("SELECT 1")
        return True
    except psycopg.OperationalError:
        return False


def test_backfill_rides_through_a_source_restart(rdb: Database, cluster: embedded.EmbeddedPostgres,
                                                  db_factory: Callable[[], Database],
                                                  write_config: Callable[..., PipelineConfig]) -> None:
    config = _config(rdb, db_factory(), write_config, rows=40_000, page=400, retry_initial_ms=200,
                     retry_max_ms=2000)
    drainer = spawn(str(config.path), "drain")
    backfiller = spawn(str(config.path), "backfill", "public.t", "--quiet")
    try:
        wait_until(lambda: backfiller.poll() is not None or (_up(rdb) and _backfills(rdb)
                                                             and _backfills(rdb)[0][2] >= 3), 60, "pages reconciled")
        assert backfiller.poll() is None, backfiller.communicate()[1][-3000:]
        pages_before = _backfills(rdb)[0][2]
        _restart(cluster)
        out, err = backfiller.communicate(timeout=180)
        assert backfiller.returncode == 0, err[-3000:]
        assert "completed" in out and "lost its session" in err, (out, err[-3000:])
        runs = _backfills(rdb)
        assert len(runs) == 1 and runs[0][1] == "completed", runs  # the same backfill: no rerun
        assert runs[0][2] > pages_before and runs[0][2] >= 100  # 40,000 rows in pages of 400
        assert _reads(rdb) == 40_000
        assert stop(drainer, signal.SIGTERM, 60)[0] == 0
    finally:
        _kill(backfiller, drainer)


def test_the_drain_completes_it_while_the_backfill_is_reconnecting(
        rdb: Database, cluster: embedded.EmbeddedPostgres, db_factory: Callable[[], Database],
        write_config: Callable[..., PipelineConfig]) -> None:
    """Every page staged, no drain: the source restarts and the backfill waits 12-18 s to reconnect; a drain
    started meanwhile completes it. Back, the backfill process reports completed and exits 0."""
    config = _config(rdb, db_factory(), write_config, rows=300, page=100, retry_initial_ms=15_000,
                     retry_max_ms=15_000)
    backfiller = spawn(str(config.path), "backfill", "public.t", "--quiet")
    drainer = None
    try:
        wait_until(lambda: backfiller.poll() is not None or _last_staged(rdb), 60,
                   "every page staged, waiting for a drain")
        _restart(cluster)
        drainer = spawn(str(config.path), "drain")
        wait_until(lambda: _up(rdb) and _backfills(rdb)[0][1] == "completed", 60, "the drain to complete it")
        out, err = backfiller.communicate(timeout=60)
        assert backfiller.returncode == 0, err[-3000:]
        assert "completed" in out and "lost its session" in err, (out, err[-3000:])
        assert "completed while this process reconnected" in err, err[-3000:]
        assert _reads(rdb) == 300
        assert stop(drainer, signal.SIGTERM, 60)[0] == 0
    finally:
        _kill(backfiller, *([drainer] if drainer else []))


def test_a_backfill_whose_process_died_reports_completed_once_the_drain_completes_it(
        rdb: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig]) -> None:
    config = _config(rdb, db_factory(), write_config, rows=300, page=100)
    backfiller = spawn(str(config.path), "backfill", "public.t", "--quiet")
    drainer = None
    try:
        wait_until(lambda: backfiller.poll() is not None or _last_staged(rdb), 60, "every page staged")
        backfiller.kill()  # dies waiting for the drain to reconcile its last pages
        backfiller.communicate()
        drainer = spawn(str(config.path), "drain")
        wait_until(lambda: _backfills(rdb)[0][1] == "completed", 60, "the drain to complete it")
        bid = _backfills(rdb)[0][0]
        listed = json.loads(subprocess.run([CLI, "--config", str(config.path), "backfill", "list", "--all", "--json"],
                                           capture_output=True, text=True, timeout=60, check=True).stdout)
        assert [(b["id"], b["status"], b["error"]) for b in listed] == [(bid, "completed", None)]
        resumed = subprocess.run([CLI, "--config", str(config.path), "backfill", "resume", bid], capture_output=True,
                                 text=True, timeout=60)
        assert resumed.returncode == 0 and "already completed" in resumed.stdout, resumed
        assert _reads(rdb) == 300
        assert stop(drainer, signal.SIGTERM, 60)[0] == 0
    finally:
        _kill(backfiller, *([drainer] if drainer else []))


def test_staged_rows_a_crash_loses_are_read_again(rdb: Database, cluster: embedded.EmbeddedPostgres,
                                                   db_factory: Callable[[], Database],
                                                   write_config: Callable[..., PipelineConfig]) -> None:
    """Staged rows are unlogged: a crash of the state database (here the source's: the default) empties them
    while their pages stay staged and their high watermarks are in the WAL. The drain reconciles none of those
    pages (it would log none of their rows); the resumed backfill reads them again, and every row is logged
    exactly once."""
    from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest
    from cdc_pipeline_tests.helpers import drain
    from cdc_pipeline_tests.integration.backfill.test_backfill import backfill

    config = _config(rdb, db_factory(), write_config, rows=300, page=100)
    runner = Backfiller(config, BackfillRequest("public.t"), progress_seconds=0,
                        on_progress=lambda p: runner.stop() if p.status == "completing" else None)
    assert runner.run().status == "interrupted"  # every page staged, its high watermark sent; no drain
    assert rdb.execute("SELECT count(*) FROM cdc_pipeline.backfill_rows") == [(300,)]
    rdb.execute("CHECKPOINT")  # what was committed is on disk (the test cluster runs without fsync)
    cluster.stop("immediate")
    cluster.start()
    assert rdb.execute("SELECT count(*) FROM cdc_pipeline.backfill_rows") == [(0,)]
    drain(config)  # reaches the four high watermarks (the last page is empty): it reconciles none
    assert rdb.execute("SELECT count(*), bool_and(status = 'staged') FROM cdc_pipeline.backfill_pages") == [(4, True)]
    assert _reads(rdb) == 0
    again = backfill(config, "public.t")
    assert again.status == "completed" and again.resumed and again.resumed_from_page == 0
    assert again.rows_read_this_run == 300
    assert rdb.execute("SELECT count(*), count(DISTINCT pk) FROM cdc_pipeline.change_log WHERE action = 'read'") \
        == [(300, 300)]
