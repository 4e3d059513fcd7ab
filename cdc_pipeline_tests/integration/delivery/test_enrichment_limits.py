"""Enrichment's promises under attack (docs/explanation/delivery.md#enrichment): the query runs in a
read-only session (one that writes fails, naming why, and nothing is written), within its statement
timeout, as an outage when the source goes away mid-query (and again once it is back), and a key with
several rows gets the first the query returns, never a repeated message."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import psycopg
import pyarrow as pa
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.delivery.enrichment import APP_NAME, Enricher, EnrichmentUnavailable
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import drain, wait_until
from cdc_pipeline_tests.integration.delivery.test_enrichment import make_config, seed


def _logged(source_db: Database, write_config: Callable[..., PipelineConfig]) -> tuple[PipelineConfig, pa.Table]:
    """A config with an enrichment and a real log batch of orders 1-4 (of customers 2, 1, 2, 1)."""
    seed(source_db)
    config = make_config(source_db, write_config, "127.0.0.1:1")
    setup(config)
    source_db.execute("INSERT INTO customers VALUES (1, 'Ada', 'gold', NULL), (2, 'Bob', NULL, NULL)")
    source_db.execute("INSERT INTO orders SELECT g, 1 + g % 2, g FROM generate_series(1, 4) g")
    drain(config)
    with psycopg.connect(config.state_dsn) as conn:
        batch = ChangeLog("cdc_pipeline").load_batch(conn, ["public.orders"], (0, -1), 1000)
    return config, batch


def _of(config: PipelineConfig, sql: str, **limits: int) -> Enricher:
    cfg = config.sink("orders").enrichment
    assert cfg is not None
    return Enricher(config.source.dsn, cfg.model_copy(update={"sql": sql, **limits}), lambda _: ("id",))


def _enrichments(batch: pa.Table) -> dict[int, object]:
    out = {}
    for pk, text in zip(batch.column("pk").to_pylist(), batch.column("enrichment").to_pylist(), strict=True):
        out[json.loads(pk)[0]] = json.loads(text)
    return out


def test_a_query_that_writes_fails_clearly_and_writes_nothing(
        source_db: Database, write_config: Callable[..., PipelineConfig]) -> None:
    source_db.execute("CREATE TABLE public.audit (id int); CREATE SEQUENCE public.seen")
    source_db.execute("CREATE FUNCTION public.audit_it(i int) RETURNS int LANGUAGE sql "
                      "AS 'INSERT INTO public.audit VALUES (i) RETURNING i'")
    writes = {"an INSERT in a function": "public.audit_it(o.id) AS audited",
              "nextval": "nextval('public.seen') AS n"}
    config, batch = _logged(source_db, write_config)
    for what, column in writes.items():
        enricher = _of(config, f"SELECT o.id, {column} FROM public.orders o WHERE o.id = ANY($1)")
        try:
            with pytest.raises(EnrichmentUnavailable, match="read-only transaction"):
                enricher.enrich(batch)
        finally:
            enricher.close()
        assert source_db.execute("SELECT count(*) FROM public.audit") == [(0,)], what
        assert source_db.execute("SELECT is_called FROM public.seen") == [(False,)], what


def test_a_query_cannot_turn_read_only_off_for_the_next_one(
        source_db: Database, write_config: Callable[..., PipelineConfig]) -> None:
    """A query may change its session's settings (set_config is no write): the session's default turned
    read-write by one batch's query, the next query still runs read-only (each its own read-only transaction)."""
    source_db.execute("CREATE SEQUENCE public.seen")
    config, batch = _logged(source_db, write_config)
    enricher = _of(config, "SELECT o.id, set_config('default_transaction_read_only', 'off', false) AS flipped "
                           "FROM public.orders o WHERE o.id = ANY($1)")
    try:
        enricher.enrich(batch)
        enricher.cfg = enricher.cfg.model_copy(update={
            "sql": "SELECT o.id, nextval('public.seen') AS n FROM public.orders o WHERE o.id = ANY($1)"})
        with pytest.raises(EnrichmentUnavailable, match="read-only transaction"):
            enricher.enrich(batch)
    finally:
        enricher.close()
    assert source_db.execute("SELECT is_called FROM public.seen") == [(False,)]


def test_a_slow_query_is_cut_at_its_timeout(source_db: Database, write_config: Callable[..., PipelineConfig]) -> None:
    config, batch = _logged(source_db, write_config)
    enricher = _of(config, "SELECT o.id, pg_sleep(30) IS NULL AS slept FROM public.orders o "
                           "WHERE o.id = ANY($1) AND o.id = 1", statement_timeout_ms=500)
    began = time.monotonic()
    try:
        with pytest.raises(EnrichmentUnavailable, match="statement timeout"):
            enricher.enrich(batch)
    finally:
        enricher.close()
    took = time.monotonic() - began
    assert took < 20, f"the query ran {took:.1f} s past its 0.5 s timeout"
    assert source_db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND "
                             "state = 'active'", (APP_NAME,)) == [(0,)]


def test_the_source_going_away_mid_query_is_an_outage_and_the_next_batch_reconnects(
        source_db: Database, write_config: Callable[..., PipelineConfig]) -> None:
    config, batch = _logged(source_db, write_config)
    enricher = _of(config, "SELECT o.id, c.name, pg_sleep((SELECT s FROM public.slow)) IS NULL AS slept "
                           "FROM public.orders o JOIN public.customers c ON c.id = o.customer_id WHERE o.id = ANY($1)")
    source_db.execute("CREATE TABLE public.slow (s float); INSERT INTO public.slow VALUES (60)")
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(enricher.enrich(batch))
        except Exception as exc:  # noqa: BLE001 - what the test looks at
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        active = "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND state = 'active'"
        wait_until(lambda: bool(source_db.execute(active, (APP_NAME,))), 60, "the enrichment query running")
        source_db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                          (APP_NAME,))
        thread.join(60)
        assert not thread.is_alive()
        [failed] = outcome
        assert isinstance(failed, EnrichmentUnavailable), failed  # the batch waits: nothing enriched as null
        source_db.execute("UPDATE public.slow SET s = 0")
        got = _enrichments(enricher.enrich(batch))  # a new session, the same batch
    finally:
        enricher.close()
    assert {k: v["name"] for k, v in got.items()} == {1: "Bob", 2: "Ada", 3: "Bob", 4: "Ada"}  # type: ignore[index]


def test_several_rows_for_a_key_give_the_first_and_never_repeat_a_message(
        source_db: Database, write_config: Callable[..., PipelineConfig]) -> None:
    """Each order joined with both customers (a query breaking "at most one row per key"): the batch keeps
    one row per change, each with the first row its query returned (here by ORDER BY)."""
    config, batch = _logged(source_db, write_config)
    enricher = _of(config, "SELECT o.id, c.name FROM public.orders o CROSS JOIN public.customers c "
                           "WHERE o.id = ANY($1) ORDER BY o.id, c.name DESC")
    try:
        enriched = enricher.enrich(batch)
    finally:
        enricher.close()
    assert enriched.num_rows == batch.num_rows == 4
    assert _enrichments(enriched) == {i: {"id": i, "name": "Bob"} for i in range(1, 5)}
