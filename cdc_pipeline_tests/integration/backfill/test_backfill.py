"""Backfills against a real PostgreSQL (and Spark for delivery): keys of every type, partial windows with
ties and NULLs, empty and vanishing tables, page-size adaptation, control (pause/resume/cancel, one
backfill per table and sink), backpressure, routing of reads to their sinks, and the reconciler's
drop rules on hand-built log states.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin import status
from cdc_pipeline.admin.setup import setup
from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest, Progress
from cdc_pipeline.backfill.watermark import WATERMARK_PREFIX, Snapshot, Watermark
from cdc_pipeline.capture.drain import Drain
from cdc_pipeline.capture.reconcile import Reconciler
from cdc_pipeline.cli import main as cli_main
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.delivery.engine import Deliverer
from cdc_pipeline.postgres.pgoutput import LogicalMessage
from cdc_pipeline.state.backfills import BackfillConflict, BackfillStore
from cdc_pipeline.state.schema import ensure_schema
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, mirror_config, rows

# -- helpers shared by the backfill tests ----------------------------------------------------------


def backfill_config(source_dsn: str, dest_dsn: str, tables: list[Any], backfill: dict[str, Any] | None = None,
                    **sink: Any) -> dict[str, Any]:
    data = mirror_config(source_dsn, dest_dsn, tables, **sink)
    data["drain"] = {"heartbeat_seconds": 0.5, "batch_ms": 100}
    if backfill:
        data["backfill"] = backfill
    return data


@contextlib.contextmanager
def drain_running(config: PipelineConfig) -> Iterator[Drain]:
    """The real drain in a background thread (in Dagster it is the drain sensor; here, a thread)."""
    d = Drain(config)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            d.run(seconds=900)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name="drain", daemon=True)
    thread.start()
    try:
        yield d
    finally:
        d.stop()
        thread.join(120)
        assert not thread.is_alive(), "drain did not stop"
    if errors:
        raise errors[0]


def backfill(config: PipelineConfig, table: str, with_drain: bool = True, **kw: Any) -> Progress:
    request_keys = {"sinks", "sort_column", "start", "end", "max_query_ms", "origin"}
    request = BackfillRequest(table, **{k: v for k, v in kw.items() if k in request_keys})
    runner = Backfiller(config, request, **{k: v for k, v in kw.items() if k not in request_keys})
    if not with_drain:
        return runner.run()
    with drain_running(config):
        return runner.run()


def log_reads(config: PipelineConfig, backfill_id: str | None = None) -> list[str]:
    with psycopg.connect(config.state_dsn) as conn:
        query = "SELECT pk FROM cdc_pipeline.change_log WHERE action = 'read'"
        if backfill_id is None:
            return [r[0] for r in conn.execute(query + " ORDER BY commit_lsn, commit_idx").fetchall()]
        return [r[0] for r in conn.execute(query + " AND backfill_id = %s ORDER BY commit_lsn, commit_idx",
                                           (backfill_id,)).fetchall()]


def pages_of(config: PipelineConfig, backfill_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(config.state_dsn) as conn:
        return BackfillStore("cdc_pipeline").pages(conn, backfill_id)


def wait_for(predicate: Callable[[], bool], timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# -- keys of every type ----------------------------------------------------------------------------

KEY_TYPES = {
    "integer": ("id integer PRIMARY KEY", "g"),
    "text": ("k text PRIMARY KEY",
             "(ARRAY[E'a\\tb', 'é', 'x\"y', E'back\\\\slash', 'ü🙂', '', ' lead', E'ctl\\x01', 'Z', 'a'])"
             "[1 + g % 10] || g"),
    "uuid": ("u uuid PRIMARY KEY", "md5(g::text)::uuid"),
    "timestamptz": ("ts timestamptz PRIMARY KEY", "'2025-01-01 00:00:00+00'::timestamptz + g * interval '1.5 s'"),
    "enum": ("m mood PRIMARY KEY", "(enum_range(NULL::mood))[g]"),
    "numeric": ("n numeric PRIMARY KEY", "g / 4.0"),
    "composite": ("a integer, b text, c timestamp, PRIMARY KEY (a, b, c)",
                  "g % 3, 'b' || (g % 5), '2025-01-01'::timestamp + g * interval '1 hour'"),
}
ENUM_VALUES = [f"v{i:02d}" for i in range(60, 0, -1)]  # enum order differs from text order


@pytest.mark.parametrize("key_type", [*KEY_TYPES, "text/separate-state", "composite/separate-state"])
def test_every_key_type_pages_exactly_once_with_the_drains_pk(key_type, source_db, db_factory, write_config,
                                                              spark):
    """Keyset cursors of every key type, 7-row pages; with the state in another database the rows
    travel COPY TO -> COPY FROM instead of one INSERT ... SELECT."""
    dest = db_factory()
    key_type, _, separate = key_type.partition("/")
    columns, values = KEY_TYPES[key_type]
    source_db.execute("CREATE TYPE mood AS ENUM (" + ", ".join(f"'{v}'" for v in ENUM_VALUES) + ")")
    source_db.execute(f"CREATE TABLE public.k ({columns}, payload text)")
    data = backfill_config(source_db.dsn, dest.dsn, ["public.k"], {"initial_page_size": 7, "max_page_size": 7})
    if separate:
        data["state"] = {"dsn": db_factory().dsn}
    config = write_config(data)
    setup(config)
    n = 60 if key_type != "composite" else 45
    select_cols = values if key_type == "composite" else f"{values}"
    source_db.execute(f"INSERT INTO public.k SELECT {select_cols}, 'p' || g FROM generate_series(1, {n}) g")
    drain(config)  # the inserts, as the drain encodes their keys
    result = backfill(config, "public.k")
    assert result.status == "completed"
    assert result.rows_read == n and result.rows_dropped == 0
    with psycopg.connect(config.state_dsn) as conn:
        inserted = sorted(r[0] for r in conn.execute(
            "SELECT pk FROM cdc_pipeline.change_log WHERE action = 'insert'").fetchall())
    reads = log_reads(config)
    assert len(reads) == n and len(set(reads)) == n  # every row exactly once, across many pages
    assert sorted(reads) == inserted  # the backfill's pk text is the drain's, byte for byte
    assert len(pages_of(config, result.backfill_id)) == n // 7 + 1
    deliver(config, spark)
    assert assert_mirrored(source_db.dsn, "public.k", dest.dsn, "mirror.k") == n


def test_empty_table_completes_with_one_empty_page(source_db, db_factory, write_config):
    dest = db_factory()
    source_db.execute("CREATE TABLE public.e (id int PRIMARY KEY, v text)")
    config = write_config(backfill_config(source_db.dsn, dest.dsn, ["public.e"]))
    setup(config)
    result = backfill(config, "public.e")
    assert (result.status, result.rows_read, result.pages) == ("completed", 0, 1)
    assert log_reads(config) == []


def test_rows_deleted_during_the_backfill_end_deleted(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE public.gone (id int PRIMARY KEY, v text)")
    source_db.execute("INSERT INTO public.gone SELECT g, 'v' || g FROM generate_series(1, 300) g")
    config = write_config(backfill_config(source_db.dsn, dest.dsn, ["public.gone"],
                                          {"initial_page_size": 50, "max_page_size": 50, "max_staged_pages": 1}))
    setup(config)
    deleted = threading.Event()

    def delete_everything(progress: Progress) -> None:
        if progress.pages_staged >= 1 and not deleted.is_set():
            deleted.set()
            source_db.execute("DELETE FROM public.gone")

    result = backfill(config, "public.gone", on_progress=delete_everything, progress_seconds=0)
    assert deleted.is_set() and result.status == "completed"
    assert result.rows_staged == 50  # the first page; the rest of the table was gone
    assert drain(config).changes == 0  # the backfill's own drain logged the deletes: nothing logged twice
    with psycopg.connect(config.state_dsn) as conn:
        log = conn.execute("SELECT action, count(*), min(commit_lsn), max(commit_lsn) FROM cdc_pipeline.change_log "
                           "GROUP BY 1 ORDER BY 3").fetchall()
    # The first page's 50 reads, then every row's delete after them (so the mirror ends empty).
    assert [(a, n) for a, n, _, _ in log] == [("read", 50), ("delete", 300)], log
    assert log[0][3] < log[1][2], log
    deliver(config, spark)
    assert rows(dest.dsn, "mirror.gone") == []


def test_rows_deleted_while_pages_are_read_concurrently(source_db, db_factory, write_config, spark):
    """Deletes racing the page reads (not between pages): every row ends deleted in the mirror."""
    dest = db_factory()
    source_db.execute("CREATE TABLE public.gone2 (id int PRIMARY KEY, v text)")
    source_db.execute("INSERT INTO public.gone2 SELECT g, repeat('v', 100) FROM generate_series(1, 5000) g")
    config = write_config(backfill_config(source_db.dsn, dest.dsn, ["public.gone2"],
                                          {"initial_page_size": 100, "max_page_size": 100}))
    setup(config)
    stop = threading.Event()

    def deleter() -> None:
        with source_db.connect() as conn:
            for lo in range(5000, 0, -25):  # from the end, so pages and deletes cross
                if stop.is_set():
                    return
                conn.execute("DELETE FROM public.gone2 WHERE id > %s", (lo - 25,))

    with drain_running(config):
        thread = threading.Thread(target=deleter)
        thread.start()
        result = Backfiller(config, BackfillRequest("public.gone2")).run()
        stop.set()
        thread.join()
    source_db.execute("DELETE FROM public.gone2")
    drain(config)
    deliver(config, spark)
    assert result.status == "completed"
    assert rows(dest.dsn, "mirror.gone2") == []


# -- partial backfills -----------------------------------------------------------------------------


def test_partial_backfills_ties_nulls_start_end_and_integer_sequences(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute(
        "CREATE TABLE public.ev (id int PRIMARY KEY, ts timestamptz, seq int NOT NULL, v text);"
        "CREATE INDEX ON public.ev (seq);"
        # 5 distinct timestamps (many ties per page boundary), every 7th row NULL
        "INSERT INTO public.ev SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE "
        "'2025-01-01 00:00:00+00'::timestamptz + (g % 5) * interval '1 day' END, 1000 - g, 'v' || g "
        "FROM generate_series(1, 100) g")
    config = write_config(backfill_config(
        source_db.dsn, dest.dsn, [{"name": "public.ev", "sort_column": "ts"}],
        {"initial_page_size": 3, "max_page_size": 3}))
    setup(config)

    def expected(where: str) -> list[str]:
        return sorted(f"[{r[0]}]" for r in source_db.execute(f"SELECT id FROM public.ev WHERE {where}"))

    # From a start position on the configured sort column (not indexed: a warning, not a failure).
    first = backfill(config, "public.ev", start="2025-01-03 00:00:00+00")
    assert first.status == "completed"
    assert any("not the first column of any index" in w for w in first.warnings)
    assert sorted(log_reads(config, first.backfill_id)) == expected("ts >= '2025-01-03 00:00:00+00'")
    assert len(log_reads(config, first.backfill_id)) == len(set(log_reads(config, first.backfill_id)))
    deliver(config, spark)
    mirrored = {r["id"] for r in rows(dest.dsn, "mirror.ev")}
    assert sorted(f"[{i}]" for i in mirrored) == expected("ts >= '2025-01-03 00:00:00+00'")  # NULLs not included

    # Start and end on the sort column, no start: everything non-NULL below the end.
    second = backfill(config, "public.ev", end="2025-01-03 00:00:00+00")
    assert sorted(log_reads(config, second.backfill_id)) == expected("ts < '2025-01-03 00:00:00+00'")
    # An integer sequence column given on the request: start inclusive, end exclusive.
    third = backfill(config, "public.ev", sort_column="seq", start="940", end="970")
    assert sorted(log_reads(config, third.backfill_id)) == expected("seq >= 940 AND seq < 970")
    assert not third.warnings  # seq is indexed
    # The sort column as the primary key itself.
    fourth = backfill(config, "public.ev", sort_column="id", start="95")
    assert log_reads(config, fourth.backfill_id) == [f"[{i}]" for i in range(95, 101)]


# -- page size ------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["same-database", "separate-state"])
def test_tiny_max_query_ms_shrinks_the_page_size(state, source_db, db_factory, write_config):
    dest = db_factory()
    source_db.execute("CREATE TABLE public.wide (id int PRIMARY KEY, a text, b text, c jsonb)")
    source_db.execute("INSERT INTO public.wide SELECT g, repeat('a', 200), md5(g::text), "
                      "jsonb_build_object('g', g, 'h', repeat('x', 100)) FROM generate_series(1, 40000) g")
    data = backfill_config(source_db.dsn, dest.dsn, ["public.wide"],
                           {"initial_page_size": 40000, "max_page_size": 40000})
    if state == "separate-state":  # a timeout mid-stream aborts the COPY FROM into the state, too
        data["state"] = {"dsn": db_factory().dsn}
    config = write_config(data)
    setup(config)
    result = backfill(config, "public.wide", max_query_ms=15)
    assert result.status == "completed"
    pages = pages_of(config, result.backfill_id)
    sizes = [p["page_size"] for p in pages]
    print("page sizes:", sizes, "timeouts:", result.timeouts)
    assert result.timeouts >= 1  # the first 40000-row select cannot finish in 15 ms
    assert sizes[0] < 40000 and max(sizes) < 40000
    assert result.rows_read == 40000 and len(set(log_reads(config))) == 40000
    # the pages that completed stayed near the budget
    assert sorted(p["read_ms"] for p in pages)[len(pages) // 2] < 15 * 2


# -- control ------------------------------------------------------------------------------------


def test_one_backfill_per_table_and_sink_pause_resume_cancel(source_db, db_factory, write_config, capsys):
    dest = db_factory()
    source_db.execute("CREATE TABLE public.c (id int PRIMARY KEY, ts timestamptz DEFAULT now())")
    source_db.execute("INSERT INTO public.c (id) SELECT g FROM generate_series(1, 100) g")
    config = write_config(backfill_config(source_db.dsn, dest.dsn, [{"name": "public.c", "sort_column": "ts"}],
                                          {"initial_page_size": 10, "max_page_size": 10, "max_staged_pages": 1}))
    setup(config)
    results: list[Progress] = []
    runner = Backfiller(config, BackfillRequest("public.c"))
    thread = threading.Thread(target=lambda: results.append(runner.run()))
    thread.start()  # no drain yet: one page is staged, then it waits for the drain
    store = BackfillStore("cdc_pipeline")
    with psycopg.connect(config.state_dsn, autocommit=True) as conn:
        wait_for(lambda: any(i.pages_staged for i in store.list(conn)), what="a staged page")
        (info,) = store.list(conn)
    bid = info.id
    with pytest.raises(BackfillConflict) as conflict:
        Backfiller(config, BackfillRequest("public.c", start="2020-01-01")).run()
    message = str(conflict.value)
    assert bid in message and "already active" in message and "public.c -> sink mirror" in message
    assert conflict.value.alive
    with pytest.raises(BackfillConflict):  # the same request while its process runs
        Backfiller(config, BackfillRequest("public.c")).run()

    assert cli_main(["--config", str(config.path), "backfill", "list"]) == 0
    assert f"{bid} public.c -> mirror: running (process alive)" in capsys.readouterr().out
    assert cli_main(["--config", str(config.path), "backfill", "pause", bid]) == 0
    with drain_running(config):
        wait_for(lambda: pages_of(config, bid)[0]["status"] == "reconciled", what="page 0 reconciled")
        time.sleep(1.0)
        assert len(pages_of(config, bid)) == 1  # paused: no new page
        collected = status.collect(config)
        assert collected["backfills"][0]["status"] == "paused"
        assert any(bid in line for line in status.render(collected).splitlines())
        assert cli_main(["--config", str(config.path), "backfill", "resume", bid]) == 0
        thread.join(60)
    assert results[0].status == "completed" and results[0].rows_read == 100

    # cancel: the runner stops before its next page; a new backfill may start at once
    runner2 = Backfiller(config, BackfillRequest("public.c"))
    thread2 = threading.Thread(target=lambda: results.append(runner2.run()))
    thread2.start()
    with psycopg.connect(config.state_dsn, autocommit=True) as conn:
        wait_for(lambda: store.list(conn, active_only=True) and store.list(conn, active_only=True)[0].pages_staged,
                 what="second backfill staged")
        bid2 = store.list(conn, active_only=True)[0].id
    assert cli_main(["--config", str(config.path), "backfill", "cancel", bid2]) == 0
    thread2.join(60)
    assert results[1].status == "cancelled"
    assert cli_main(["--config", str(config.path), "backfill", "resume", bid2]) == 1  # already cancelled
    with drain_running(config):
        third = Backfiller(config, BackfillRequest("public.c")).run()
    assert third.status == "completed"
    assert set(log_reads(config, bid2)) == set()  # its staged page was dropped, never reconciled


def test_stopped_backfill_resumes_from_its_checkpoint(source_db, db_factory, write_config):
    dest = db_factory()
    source_db.execute("CREATE TABLE public.r (id int PRIMARY KEY)")
    source_db.execute("INSERT INTO public.r SELECT g FROM generate_series(1, 1000) g")
    config = write_config(backfill_config(source_db.dsn, dest.dsn, ["public.r"],
                                          {"initial_page_size": 100, "max_page_size": 100}))
    setup(config)
    holder: list[Backfiller] = []

    def stop_after_three(progress: Progress) -> None:
        if progress.pages_staged >= 3:
            holder[0].stop()

    holder.append(Backfiller(config, BackfillRequest("public.r"), on_progress=stop_after_three, progress_seconds=0))
    with drain_running(config):
        first = holder[0].run()
        assert first.status == "interrupted"
        again = Backfiller(config, BackfillRequest("public.r")).run()
    assert again.backfill_id == first.backfill_id and again.resumed and again.resumed_from_page == 3
    assert again.status == "completed" and again.rows_read_this_run == 700
    assert again.rows_staged == 1000 and sorted(log_reads(config)) == sorted(f"[{i}]" for i in range(1, 1001))


def test_cli_backfill_runs_with_its_own_drain_and_reports_conflicts(source_db, db_factory, write_config, capsys):
    dest = db_factory()
    source_db.execute("CREATE TABLE public.cl (id int PRIMARY KEY, n int)")
    source_db.execute("INSERT INTO public.cl SELECT g, g % 10 FROM generate_series(1, 500) g")
    # Pages of 100: the backfill stopped after its first page below still has pages to read (with one page,
    # the drain could finish it after the stop and the conflict asserted below would not arise).
    config = write_config(backfill_config(source_db.dsn, dest.dsn, ["public.cl"],
                                          backfill={"initial_page_size": 100, "max_page_size": 100}))
    setup(config)
    base = ["--config", str(config.path), "backfill"]
    assert cli_main([*base, "public.cl", "--drain", "--json", "--sort-column", "n", "--start", "5"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["status"] == "completed" and out["rows_read"] == 250 and out["sinks"] == "mirror"
    assert any("not the first column of any index" in w for w in out["warnings"])
    # a second request while one is active (interrupted, no process) says what to do
    runner = Backfiller(config, BackfillRequest("public.cl"), on_progress=lambda p: runner.stop(), progress_seconds=0)
    with drain_running(config):
        assert runner.run().status == "interrupted"
    assert cli_main([*base, "public.cl", "--end", "3", "--sort-column", "n"]) == 1
    err = capsys.readouterr().err
    assert "already active for public.cl -> sink mirror" in err and "backfill resume" in err
    assert cli_main([*base, "list"]) == 0
    assert "(no process: resume it)" in capsys.readouterr().out
    assert cli_main([*base, "nosuch.table"]) == 2  # a config error: unknown table
    assert cli_main([*base, "public.cl", "--sink", "nope"]) == 2


# -- routing and backpressure ------------------------------------------------------------------------


def test_reads_reach_only_the_backfills_sinks(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE public.rt (id int PRIMARY KEY, v text)")
    source_db.execute("INSERT INTO public.rt SELECT g, 'v' FROM generate_series(1, 200) g")
    data = backfill_config(source_db.dsn, dest.dsn, ["public.rt"])
    data["sinks"].append({"name": "other", "tables": ["public.rt"], "destination": {
        "type": "postgres", "dsn": dest.dsn, "table": "other.{table}", "mode": "mirror"}})
    config = write_config(data)
    setup(config)
    result = backfill(config, "public.rt", sinks=("mirror",))
    assert result.status == "completed"
    source_db.execute("UPDATE public.rt SET v = 'changed' WHERE id = 7")
    drain(config)
    deliver(config, spark, sink="mirror")
    deliver(config, spark, sink="other")
    assert_mirrored(source_db.dsn, "public.rt", dest.dsn, "mirror.rt")
    assert rows(dest.dsn, "other.rt") == [{"id": 7, "v": "changed"}]  # the change, not the reads


def test_sink_backlog_holds_the_backfill_until_delivery_catches_up(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE public.bp (id int PRIMARY KEY, v text)")
    source_db.execute("INSERT INTO public.bp SELECT g, 'v' FROM generate_series(1, 2000) g")
    config = write_config(backfill_config(source_db.dsn, dest.dsn, ["public.bp"],
                                          {"initial_page_size": 200, "max_page_size": 200,
                                           "max_sink_backlog": 300}))
    setup(config)
    notes: list[str] = []
    runner = Backfiller(config, BackfillRequest("public.bp"), on_progress=lambda p: notes.append(p.note),
                        progress_seconds=0)
    results: list[Progress] = []
    with drain_running(config):
        thread = threading.Thread(target=lambda: results.append(runner.run()))
        thread.start()
        wait_for(lambda: any("max_sink_backlog" in n for n in notes), what="backlog backpressure")
        time.sleep(1.5)
        held = runner.progress
        assert held is not None and held.rows_staged <= 600 and thread.is_alive()
        deliverer = Deliverer(config, config.sink("mirror"), spark)
        dthread = threading.Thread(target=lambda: deliverer.run(until_idle=False, seconds=240))
        dthread.start()
        thread.join(240)
        deliverer.stop()
        dthread.join(120)
    assert results[0].status == "completed" and results[0].rows_read == 2000
    deliver(config, spark)
    assert assert_mirrored(source_db.dsn, "public.bp", dest.dsn, "mirror.bp") == 2000


# -- the reconciler's rules on hand-built states -------------------------------------------------------


def test_reconciler_drops_what_the_snapshot_missed(db_factory):
    """Stage one page by hand, lay out log rows around its watermarks, reconcile, check what is kept.

    The commit-record-vs-visibility race cannot be produced on demand, so its outcome (a change that
    committed before the low watermark by a transaction the snapshot still saw as running) is
    written into the log directly; everything else is the real reconciler against real PostgreSQL.
    """
    db = db_factory()
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        ensure_schema(conn, "cdc_pipeline")
    xmax = (7 << 32) + 1000  # epoch 7, so 32-bit xids differ from the xid8 values
    snapshot = Snapshot(xmin=xmax - 10, xmax=xmax, xip=(xmax - 5, xmax - 3))
    high_xid = xmax + 50
    low, high = (1000, 0), (2000, 0)
    pk = [f"[{i}]" for i in range(1, 13)]

    def change(lsn: int, xid8: int, action: str, key: str | None, record: dict[str, Any] | None = None,
               changes: dict[str, Any] | None = None) -> tuple[Any, ...]:
        return (lsn, 0, xid8 % (1 << 32), "public", "t", action, key, json.dumps(record or {}),
                json.dumps(changes) if changes is not None else None)

    log = [
        change(900, xmax - 20, "update", pk[0]),  # before low, visible: keep row 1
        change(950, xmax - 5, "update", pk[1]),  # before low, in xip: drop row 2
        change(960, xmax + 10, "delete", pk[2]),  # before low, xid >= xmax (< high's): drop row 3
        change(1500, xmax - 20, "update", pk[3]),  # between the watermarks: drop row 4
        change(970, xmax - 3, "update", "[99]", {"id": 99}, {"id": 5}),  # unseen key change 5 -> 99: drop row 5
        change(980, xmax - 20, "update", "[98]", {"id": 98}, {"id": 6}),  # seen key change 6 -> 98: keep row 6
        change(2500, xmax - 5, "update", pk[6]),  # after high: keep row 7 (it follows the read)
        change(1600, xmax - 20, "read", pk[7]),  # another backfill's read: not a change, keep row 8
        change(940, xmax + 60, "update", pk[8]),  # xid beyond high's xid before low (impossible): keep 9
        change(1700, xmax + 3, "update", "[1001]"),  # another key in the window: irrelevant
    ]
    with psycopg.connect(db.dsn) as conn:
        s = "cdc_pipeline"
        conn.execute(f"INSERT INTO {s}.backfills (id, identity, table_schema, table_name, sinks, primary_key, keyset) "
                     "VALUES ('bf', 'x', 'public', 't', '{mirror}', '{id}', '{id}')")
        conn.execute(f"INSERT INTO {s}.backfill_pages (backfill_id, page_no, snapshot, read_at, page_size, rows, "
                     "read_ms, cursor, last) VALUES ('bf', 0, %s, now(), 20, 12, 1, '{12}', true)", (str(snapshot),))
        conn.execute(f"INSERT INTO {s}.backfill_low_watermarks VALUES ('bf', 0, %s, %s)", low)
        conn.cursor().executemany(
            f"INSERT INTO {s}.backfill_rows (backfill_id, page_no, seq, pk, record) VALUES ('bf', 0, %s, %s, %s)",
            [(i + 1, k, json.dumps({"id": i + 1})) for i, k in enumerate(pk)])  # seq from 1, as staged
        conn.cursor().executemany(
            f"INSERT INTO {s}.change_log (commit_lsn, commit_idx, xid, table_schema, table_name, action, pk, record, "
            "changes, commit_ts) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, now())", log)
        reconciler = Reconciler(s)
        high_msg = LogicalMessage(True, high[0], WATERMARK_PREFIX, signed(conn, "bf", high_xid))
        taken, inserted = reconciler(high_msg, high[0], high[1], conn)
        assert taken == 12  # every staged row's position, dropped or not
        assert reconciler(high_msg, high[0], high[1] + 100, conn) == (0, 0)  # a re-sent high watermark: no-op
        conn.commit()
        kept = [r[0] for r in conn.execute(
            f"SELECT pk FROM {s}.change_log WHERE backfill_id = 'bf' ORDER BY commit_idx").fetchall()]
        assert kept == [pk[0], pk[5], pk[6], pk[7], pk[8], *pk[9:]]
        assert inserted == len(kept)
        positions = conn.execute(f"SELECT commit_lsn, commit_idx FROM {s}.change_log WHERE backfill_id = 'bf' "
                                 "ORDER BY commit_idx").fetchall()
        # Row seq s sits at the high watermark's position + s - 1, a dropped row's left empty.
        assert positions == [(high[0], high[1] + i) for i in (0, 5, 6, 7, 8, 9, 10, 11)]
        checkpoint = conn.execute(f"SELECT status, cursor, pages, rows_read, rows_dropped FROM {s}.backfills").fetchone()
        assert checkpoint == ("completed", ["12"], 1, 12, 12 - len(kept))
        # The page's staged rows went with the statement that logged them, dropped ones too.
        assert conn.execute(f"SELECT count(*) FROM {s}.backfill_rows WHERE backfill_id = 'bf'").fetchone() == (0,)

        # A truncate between the watermarks drops the whole page.
        conn.execute(f"INSERT INTO {s}.backfills (id, identity, table_schema, table_name, sinks, primary_key, keyset) "
                     "VALUES ('bf2', 'y', 'public', 't', '{mirror}', '{id}', '{id}')")
        conn.execute(f"INSERT INTO {s}.backfill_pages (backfill_id, page_no, snapshot, read_at, page_size, rows, "
                     "read_ms, cursor, last) VALUES ('bf2', 0, %s, now(), 20, 2, 1, '{2}', false)", (str(snapshot),))
        conn.execute(f"INSERT INTO {s}.backfill_low_watermarks VALUES ('bf2', 0, 3000, 0)")
        conn.execute(f"INSERT INTO {s}.backfill_rows (backfill_id, page_no, seq, pk, record) VALUES "
                     "('bf2', 0, 1, '[1]', '{}'), ('bf2', 0, 2, '[2]', '{}')")
        conn.execute(f"INSERT INTO {s}.change_log (commit_lsn, commit_idx, xid, table_schema, table_name, action, "
                     "commit_ts) VALUES (3500, 0, 5, 'public', 't', 'truncate', now())")
        msg = LogicalMessage(True, 4000, WATERMARK_PREFIX, signed(conn, "bf2", high_xid))
        assert reconciler(msg, 4000, 0, conn) == (2, 0)  # positions taken, nothing logged
        assert conn.execute(f"SELECT count(*) FROM {s}.backfill_rows WHERE backfill_id = 'bf2'").fetchone() == (0,)
        conn.commit()


def signed(conn: psycopg.Connection, backfill_id: str, xid: int) -> bytes:
    """A high watermark as the backfill would emit it: signed with the backfill's key."""
    key = BackfillStore("cdc_pipeline").mac_key(conn, backfill_id)
    return Watermark(backfill_id, 0, "high", xid=xid).encode(key).encode()


def test_snapshot_unseen_ranges_across_xid_wraparound():
    snap = Snapshot.parse(f"{(3 << 32) - 5}:{(3 << 32) - 2}:{(3 << 32) - 4}")
    exact, ranges = snap.unseen((3 << 32) + 7)
    assert exact == [(1 << 32) - 4]
    assert ranges == [((1 << 32) - 2, 1 << 32), (0, 7)]
    assert snap.unseen(snap.xmax) == (exact, [])
    assert not snap.sees((3 << 32) - 4) and snap.sees((3 << 32) - 6) and not snap.sees((3 << 32) + 1)


def test_copy_text_lines_parse_back_to_values():
    from cdc_pipeline.backfill.copytext import parse_line

    # raw bytes as COPY TO writes them: tab-separated, \\N for NULL, backslash escapes
    assert parse_line(rb"a\\b" + b"\t" + rb"x\ty" + b"\t" + rb"\N" + b"\n") == ["a\\b", "x\ty", None]
    assert parse_line(rb'["1", "c\\td"]' + b"\n") == ['["1", "c\\td"]']


def test_a_high_watermark_seals_only_the_staging_it_was_sent_for(db_factory):
    """A page staged again (its first staging lost with a state database restored or crashed) is not
    sealed by the first staging's high watermark: the token differs, so the drain waits for its own."""
    from datetime import UTC, datetime

    from cdc_pipeline.backfill.watermark import page_token

    db = db_factory()
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        ensure_schema(conn, "cdc_pipeline")
    read_at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    with psycopg.connect(db.dsn) as conn:
        conn.execute("INSERT INTO cdc_pipeline.backfills (id, identity, table_schema, table_name, sinks, "
                     "primary_key, keyset) VALUES ('bf', 'x', 'public', 't', '{m}', '{id}', '{id}')")
        conn.execute("INSERT INTO cdc_pipeline.backfill_pages (backfill_id, page_no, snapshot, read_at, page_size, "
                     "rows, read_ms, cursor, last) VALUES ('bf', 0, '10:10:', %s, 5, 1, 1, '{1}', true)", (read_at,))
        conn.execute("INSERT INTO cdc_pipeline.backfill_low_watermarks VALUES ('bf', 0, 100, 0)")
        conn.execute("INSERT INTO cdc_pipeline.backfill_rows (backfill_id, page_no, seq, pk, record) "
                     "VALUES ('bf', 0, 1, '[1]', '{\"id\": 1}')")
        reconciler = Reconciler("cdc_pipeline")

        def high(token: str) -> LogicalMessage:
            key = BackfillStore("cdc_pipeline").mac_key(conn, "bf")
            return LogicalMessage(True, 200, WATERMARK_PREFIX,
                                  Watermark("bf", 0, "high", xid=20, token=token).encode(key).encode())

        assert reconciler(high(page_token("9:9:", read_at)), 200, 0, conn) == (0, 0)  # an older staging's
        assert reconciler(high(page_token("10:10:", read_at)), 300, 0, conn) == (1, 1)
        conn.commit()
