"""Watermark authentication (issue 15.3): any role that can log in to the source can emit a logical message
with the watermark prefix; the drain acts only on watermarks signed with the backfill's key, and only on
transactional ones."""

from __future__ import annotations

import json

import psycopg
from psycopg import conninfo, sql

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.backfill.watermark import WATERMARK_PREFIX, Watermark
from cdc_pipeline.state.backfills import BackfillStore
from cdc_pipeline_tests.helpers import backfill_page, drain
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill_config


def _log(dsn: str) -> list[tuple[str, str, str | None]]:
    with psycopg.connect(dsn) as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(
            "SELECT pk, action, record->>'v' FROM cdc_pipeline.change_log ORDER BY commit_lsn, commit_idx")]


def test_forged_watermarks_are_ignored(source_db, db_factory, write_config) -> None:
    source_db.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
    source_db.execute("INSERT INTO public.t SELECT g, 'old' FROM generate_series(1, 10) g")
    # Another login role, with nothing granted but what PUBLIC has (pg_logical_emit_message in PG 15).
    source_db.execute("DROP ROLE IF EXISTS cdc_mallory")
    source_db.execute("CREATE ROLE cdc_mallory LOGIN PASSWORD 'm'")
    config = write_config(backfill_config(source_db.dsn, db_factory().dsn, ["public.t"]))
    setup(config)
    store = BackfillStore("cdc_pipeline")
    mallory_dsn = conninfo.make_conninfo(source_db.dsn, user="cdc_mallory", password="m")
    try:
        with backfill_page(config, "public.t", 100) as page, \
                psycopg.connect(config.state_dsn, autocommit=True) as state, \
                psycopg.connect(mallory_dsn, autocommit=True) as mallory:
            bid, key = page.backfill_id, page.mac_key
            assert page.rows == 10
            # The backfill id is no secret (it is in metadata): forge high watermarks for the staged page,
            # before a change the page's read does not reflect.
            forged = [
                (True, json.dumps({"id": bid, "page": 0, "kind": "high", "xid": "3"})),  # unsigned
                (True, Watermark(bid, 0, "high", xid=3).encode("guessed-key")),  # wrong key
                (False, Watermark(bid, 0, "high", xid=3, token=page.token).encode(key)),  # outside a transaction
            ]
            for transactional, content in forged:
                mallory.execute("SELECT pg_logical_emit_message(%s, %s, %s)", (transactional, WATERMARK_PREFIX, content))
            source_db.execute("UPDATE public.t SET v = 'new' WHERE id = 5")
            drain(config)
            assert store.get(state, bid).pages == 0, "a forged watermark reconciled the page"
            assert [a for _, a, _ in _log(config.state_dsn)] == ["update"]
            page.close()
        drain(config)
        log = _log(config.state_dsn)
        # The real high watermark comes after the update: the stale read of row 5 is dropped, the rest are read.
        assert log[0] == ("[5]", "update", "new")
        assert sorted(log[1:]) == sorted((f"[{i}]", "read", "old") for i in range(1, 11) if i != 5)
        assert store.get(psycopg.connect(config.state_dsn, autocommit=True), bid).status == "completed"
    finally:
        with psycopg.connect(source_db.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY cdc_mallory"))
            conn.execute("DROP ROLE cdc_mallory")
