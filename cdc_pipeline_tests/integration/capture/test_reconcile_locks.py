"""Row locks the drain takes while reconciling a page (the backfill's checkpoint) are released at the end of
the watermark's own transaction, not held until a later, possibly huge, source transaction is in the log:
`backfill pause` and `cancel` do not wait behind it (issue 9.13)."""

from __future__ import annotations

import threading

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.capture.drain import Drain
from cdc_pipeline.state.backfills import BackfillStore
from cdc_pipeline_tests.helpers import backfill_page
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill_config

BLOCK = "cdc_test.block"


def test_pause_does_not_wait_for_the_next_source_transaction(source_db, db_factory, write_config) -> None:
    source_db.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    source_db.execute("INSERT INTO public.t SELECT g, 'v' FROM generate_series(1, 10) g")
    config = write_config(backfill_config(source_db.dsn, db_factory().dsn, ["public.t"]))
    setup(config)
    with backfill_page(config, "public.t", 5) as page:
        page.close()
    bid, store = page.backfill_id, BackfillStore(config.state.schema_name)
    # Right behind the page: a source transaction the drain is slow to get through (a hook blocks in it,
    # standing in for millions of rows).
    with source_db.connect() as conn, conn.transaction():
        conn.execute("INSERT INTO public.t VALUES (11, 'v')")
        conn.execute("SELECT pg_logical_emit_message(true, %s, '')", (BLOCK,))
        conn.execute("INSERT INTO public.t VALUES (12, 'v')")

    inside, release = threading.Event(), threading.Event()

    def block(*_: object) -> tuple[int, int]:
        inside.set()
        release.wait(60)
        return 0, 0  # (positions taken, rows logged)

    drain = Drain(config, {BLOCK: block})
    errors: list[BaseException] = []

    def run() -> None:
        try:
            drain.run(until_idle=True, seconds=120)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert inside.wait(60), "the drain never reached the slow transaction"
        with psycopg.connect(config.state_dsn, autocommit=True) as conn:
            # The page's checkpoint is committed while the drain is still inside the next transaction ...
            assert conn.execute("SELECT status FROM cdc_pipeline.backfill_pages WHERE backfill_id = %s",
                                (bid,)).fetchone() == ("reconciled",)
            # ... so pausing it takes no wait for the drain's transaction.
            conn.execute("SET lock_timeout = '2s'")
            assert store.set_status(conn, bid, "paused") == "running"
            assert store.set_status(conn, bid, "cancelled") == "paused"
    finally:
        release.set()
        thread.join(60)
    assert not errors, errors
    with psycopg.connect(config.state_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM cdc_pipeline.change_log WHERE action = 'insert'").fetchone() == (2,)
