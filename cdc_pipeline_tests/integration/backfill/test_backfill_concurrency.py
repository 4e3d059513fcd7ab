"""A 200,000-row backfill racing four writers and the drain, in-process and as a SIGKILLed CLI process.

Writers update (incrementing `version`), insert and delete random rows the whole time, half of their
updates aimed just ahead of the backfill's cursor so pages and changes collide. At the end the mirror
must equal the source, and an `append` sink that records every message in arrival order must show no
row's `version` ever going backwards: a stale read delivered after a newer change would.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.state.backfills import BackfillStore
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill_config, drain_running, wait_for

ROWS = 200_000
# The SIGKILL and side-by-side tests prove resumption and parallel windows, which do not depend on the
# table's size but on its number of pages and on writers colliding with them: they keep the 200k test's
# page counts (40 pages; 10 per window) on a quarter of the rows, with page sizes scaled to match.
SMALL_ROWS = 50_000
CLI = str(Path(sys.executable).with_name("cdc-pipeline"))


def make_table(source_db: Any, rows: int = ROWS) -> None:
    source_db.execute(
        f"CREATE SEQUENCE public.acct_ids START {rows + 1};"
        "CREATE TABLE public.acct (id bigint PRIMARY KEY, version integer NOT NULL, owner integer, "
        "payload text, updated_at timestamptz NOT NULL DEFAULT now());"
        f"INSERT INTO public.acct SELECT g, 0, g % 97, md5(g::text) || repeat('x', 60), now() "
        f"FROM generate_series(1, {rows}) g")


def two_sinks(source_db: Any, dest: Any, **backfill: Any) -> dict[str, Any]:
    data = backfill_config(source_db.dsn, dest.dsn, ["public.acct"], {"max_page_size": 20000, **backfill})
    data["sinks"].append({"name": "arrivals", "tables": ["public.acct"], "batch_size": 50000, "destination": {
        "type": "postgres", "dsn": dest.dsn, "table": "arrivals.acct", "mode": "append"}})
    data["sinks"][0]["batch_size"] = 50000
    return data


class Writers:
    """Four writer threads: updates (version + 1), inserts and deletes until stopped."""

    def __init__(self, dsn: str, state_dsn: str, seed: int, rows: int = ROWS) -> None:
        self.dsn = dsn
        self.rows = rows
        self.state_dsn = state_dsn
        self.stop_event = threading.Event()
        self.cursor = 1  # near where the backfill reads (refreshed from its pages)
        self.counts = {"update": 0, "insert": 0, "delete": 0}
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._write, args=(seed + i,), daemon=True) for i in range(4)]
        self.threads.append(threading.Thread(target=self._follow, daemon=True))

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(30)
        if self.errors:
            raise self.errors[0]

    def _follow(self) -> None:
        try:
            with psycopg.connect(self.state_dsn, autocommit=True) as conn:
                while not self.stop_event.is_set():
                    row = conn.execute("SELECT cursor FROM cdc_pipeline.backfill_pages WHERE cursor IS NOT NULL "
                                       "ORDER BY staged_at DESC LIMIT 1").fetchone() if _has_pages(conn) else None
                    if row:
                        self.cursor = int(row[0][0])
                    time.sleep(0.02)
        except BaseException as exc:
            self.errors.append(exc)

    def _write(self, seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop_event.is_set():
                    with conn.transaction():
                        for _ in range(rng.randint(1, 3)):
                            op = rng.random()
                            if op < 0.7:
                                near = rng.random() < 0.5
                                target = self.cursor + rng.randint(0, 3000) if near else rng.randint(1, self.rows * 41 // 40)
                                conn.execute("UPDATE public.acct SET version = version + 1, updated_at = now(), "
                                             "owner = %s WHERE id = %s", (rng.randint(0, 96), target))
                                self.counts["update"] += 1
                            elif op < 0.85:
                                conn.execute("INSERT INTO public.acct (id, version, owner, payload) "
                                             "VALUES (nextval('public.acct_ids'), 0, 1, 'new')")
                                self.counts["insert"] += 1
                            else:
                                target = self.cursor + rng.randint(0, 3000) if rng.random() < 0.5 \
                                    else rng.randint(1, self.rows * 41 // 40)
                                conn.execute("DELETE FROM public.acct WHERE id = %s", (target,))
                                self.counts["delete"] += 1
                    time.sleep(rng.random() * 0.004)
        except BaseException as exc:
            self.errors.append(exc)


def _has_pages(conn: psycopg.Connection) -> bool:
    row = conn.execute("SELECT to_regclass('cdc_pipeline.backfill_pages')").fetchone()
    return bool(row and row[0])


def check_final_state(config: PipelineConfig, source_db: Any, dest: Any, spark: Any) -> dict[str, int]:
    drain(config)
    t0 = time.monotonic()
    deliver(config, spark, sink="mirror")
    deliver(config, spark, sink="arrivals")
    print(f"delivery of both sinks: {time.monotonic() - t0:.1f} s")
    n = assert_mirrored(source_db.dsn, "public.acct", dest.dsn, "mirror.acct", order="id")
    with psycopg.connect(dest.dsn) as conn:
        backwards = conn.execute(
            "SELECT count(*) FROM (SELECT (message->'record'->>'version')::int AS v, lag((message->'record'->>'version')"
            "::int) OVER (PARTITION BY message->'record'->>'id' ORDER BY commit_lsn, commit_idx) AS prev "
            "FROM arrivals.acct WHERE action <> 'delete') t WHERE v < prev").fetchone()
        reads = conn.execute("SELECT count(*) FROM arrivals.acct WHERE action = 'read'").fetchone()
        changes = conn.execute("SELECT count(*) FROM arrivals.acct WHERE action <> 'read'").fetchone()
    assert backwards == (0,), f"{backwards[0]} messages carry an older version than one delivered before them"
    assert reads is not None and changes is not None
    return {"rows": n, "reads": int(reads[0]), "changes": int(changes[0])}


def test_200k_rows_backfilled_while_four_writers_and_the_drain_run(source_db, db_factory, write_config, spark):
    dest = db_factory()
    make_table(source_db)
    config = write_config(two_sinks(source_db, dest))
    setup(config)
    t0 = time.monotonic()
    with drain_running(config), Writers(source_db.dsn, config.state_dsn, seed=1) as writers:
        result = Backfiller(config, BackfillRequest("public.acct")).run()
        backfill_seconds = time.monotonic() - t0
        time.sleep(0.5)  # writers keep going after the backfill, too
    print(f"backfill: {result.line()} in {backfill_seconds:.1f} s; writes {writers.counts}")
    assert result.status == "completed"
    assert result.rows_dropped > 0  # pages and changes did collide
    figures = check_final_state(config, source_db, dest, spark)
    print(figures)
    assert figures["reads"] == result.rows_emitted
    assert result.rows_read <= ROWS + writers.counts["insert"]


@pytest.mark.slow
def test_sigkilled_backfill_process_resumes_from_its_checkpoint(source_db, db_factory, write_config, spark):
    dest = db_factory()
    make_table(source_db, SMALL_ROWS)
    config = write_config(two_sinks(source_db, dest, initial_page_size=1250, max_page_size=1250))
    setup(config)
    assert config.path
    command = [CLI, "--config", config.path, "backfill", "public.acct", "--wait", "--quiet"]
    rng = random.Random(7)
    store = BackfillStore("cdc_pipeline")

    def staged_pages() -> int:
        with psycopg.connect(config.state_dsn) as conn:
            row = conn.execute("SELECT count(*) FROM cdc_pipeline.backfill_pages").fetchone()
            return int(row[0]) if row else 0

    kills = 0
    with drain_running(config), Writers(source_db.dsn, config.state_dsn, seed=2, rows=SMALL_ROWS) as writers:
        while True:
            before = staged_pages()
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            if kills == 3:
                out, err = proc.communicate(timeout=600)
                assert proc.returncode == 0, f"final run failed:\n{out}\n{err}"
                break
            # Let it make progress (at least one new page), then kill it at a random moment.
            wait_for(lambda b=before, p=proc: staged_pages() > b or p.poll() is not None, timeout=120,
                     what="the backfill process to stage a page")
            # Within the next page or two (1250-row pages take ~0.07 s here; 5000-row ones took 0.36 s).
            time.sleep(rng.uniform(0.0, 0.15))
            assert proc.poll() is None, f"finished before the kill: {proc.communicate()}"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            kills += 1
    print(f"writes: {writers.counts}; final run: {out.strip()}")
    with psycopg.connect(config.state_dsn, autocommit=True) as conn:
        (info,) = store.list(conn, active_only=False)
        pages = store.pages(conn, info.id)
    assert info.status == "completed"
    attempts = info.page_attempts
    assert attempts <= len(pages) + kills, f"{attempts} page reads for {len(pages)} pages and {kills} kills"
    max_page = max(p["page_size"] for p in pages)
    with psycopg.connect(source_db.dsn) as conn:
        row = conn.execute("SELECT last_value FROM public.acct_ids").fetchone()
        table_size = int(row[0]) if row else SMALL_ROWS
    fetched = sum(p["rows"] for p in pages) + (attempts - len(pages)) * max_page
    assert fetched <= table_size + kills * max_page
    assert info.rows_read == sum(p["rows"] for p in pages)  # every staged page reconciled once
    figures = check_final_state(config, source_db, dest, spark)
    print(figures, f"rows read {info.rows_read}, dropped {info.rows_dropped}, pages {len(pages)}, "
          f"page reads {attempts} for {kills} kills")
    assert figures["reads"] == info.rows_read - info.rows_dropped


def test_two_partitions_backfilled_side_by_side_under_writers(source_db, db_factory, write_config, spark):
    """Two windows of one table to the same sinks at once (backfill.max_parallel): neither waits for the
    other, and the mirror and the append sink end as exactly as with one backfill."""
    dest = db_factory()
    make_table(source_db, SMALL_ROWS)
    config = write_config(two_sinks(source_db, dest, max_page_size=2500))
    setup(config)
    windows = [("1", str(SMALL_ROWS // 2)), (str(SMALL_ROWS // 2), str(10**9))]
    results: list[Any] = []
    errors: list[BaseException] = []
    running = threading.Barrier(2)

    def run(start: str, end: str) -> None:
        try:
            running.wait(30)
            request = BackfillRequest("public.acct", sort_column="id", start=start, end=end)
            results.append(Backfiller(config, request, wait_if_busy=False).run())  # a conflict would raise
        except BaseException as exc:
            errors.append(exc)

    with drain_running(config), Writers(source_db.dsn, config.state_dsn, seed=3, rows=SMALL_ROWS) as writers:
        threads = [threading.Thread(target=run, args=w) for w in windows]
        for t in threads:
            t.start()
        active: list[Any] = []

        def both_alive_or_done() -> bool:
            with psycopg.connect(config.state_dsn) as conn:
                active[:] = [i for i in BackfillStore("cdc_pipeline").list(conn, active_only=True) if i.alive]
            return len(active) == 2 or not any(t.is_alive() for t in threads)

        wait_for(both_alive_or_done, 300, "the two windows to run")
        for t in threads:
            t.join(600)
        time.sleep(0.5)
    assert not errors, errors
    assert len(active) == 2, "the two windows did not run side by side"
    assert sorted(r.status for r in results) == ["completed", "completed"]
    figures = check_final_state(config, source_db, dest, spark)
    print(figures, writers.counts)
    assert figures["reads"] == sum(r.rows_emitted for r in results)
