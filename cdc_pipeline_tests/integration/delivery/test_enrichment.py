"""Enrichment: one query per batch against the source puts each order's customer into metadata.enrichment,
byte-identical on the Spark and Arrow paths; a failing query is an outage (waited for), never parked."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.check import check
from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.delivery.arrow_stage import run_arrow_stage
from cdc_pipeline.delivery.dry_run import DryRun
from cdc_pipeline.delivery.engine import Deliverer
from cdc_pipeline.delivery.enrichment import EnrichmentUnavailable
from cdc_pipeline.delivery.plan import SinkPlan
from cdc_pipeline.delivery.spark_stage import run_stage
from cdc_pipeline.state import relations
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import drain, wait_until
from cdc_pipeline_tests.kafka_broker import TansuBroker, broker

ENRICH = ("SELECT o.id, c.name AS customer_name, c.tier, c.since FROM public.orders o "
          "JOIN public.customers c ON c.id = o.customer_id WHERE o.id = ANY($1)")


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[TansuBroker]:
    yield from broker(tmp_path)


def make_config(source_db: Database, write_config: Callable[..., PipelineConfig], bootstrap: str,
                sql: str = ENRICH, name: str = "cdc.yaml", **sink: Any) -> PipelineConfig:
    return write_config({
        "source": {"dsn": source_db.dsn, "slot": "enrich", "publication": "enrich"},
        "spark": {"master": "local[2]"},
        "drain": {"heartbeat_seconds": 1, "batch_ms": 100},
        "tables": [{"name": "public.orders"}, {"name": "public.customers"}],
        "sinks": [{"name": "orders", "tables": ["public.orders", "public.customers"],
                   "enrichment": {"table": "public.orders", "sql": sql},
                   "destination": {"type": "kafka", "bootstrap_servers": bootstrap, "topic": "orders"}, **sink}],
    }, name=name)


def seed(source_db: Database) -> None:
    source_db.execute("CREATE TABLE customers (id int PRIMARY KEY, name text, tier text, since timestamptz)")
    source_db.execute("CREATE TABLE orders (id int PRIMARY KEY, customer_id int, amount numeric)")


def test_orders_carry_their_customer_on_both_paths_and_over_kafka(
        source_db: Database, write_config: Callable[..., PipelineConfig], spark: Any, kafka: TansuBroker) -> None:
    seed(source_db)
    config = make_config(source_db, write_config, kafka.bootstrap)
    assert [f.message for f in check(config) if "enrichment" in f.subject] == ["adds customer_name, tier, since"]
    setup(config)
    source_db.execute("INSERT INTO customers VALUES (1, 'Ada \"A\" é', 'gold', '2026-01-02 03:04:05+05'), "
                      "(2, 'Bob', NULL, NULL)")
    source_db.execute("INSERT INTO orders SELECT g, 1 + g % 2, g * 1.5 FROM generate_series(1, 40) g")
    source_db.execute("INSERT INTO orders VALUES (41, 99, 1)")  # no such customer: enrichment null
    source_db.execute("UPDATE orders SET amount = 0 WHERE id = 2")
    source_db.execute("DELETE FROM orders WHERE id = 3")  # deleted before the read: no row, null
    drain(config)
    source_db.execute("UPDATE customers SET tier = 'platinum' WHERE id = 1")  # read after the change: current
    with psycopg.connect(config.state_dsn) as conn:
        batch = ChangeLog("cdc_pipeline").load_batch(conn, ["public.orders", "public.customers"], (0, -1), 1000)
    deliverer = Deliverer(config, config.sink("orders"), spark)
    enriched = deliverer.enricher.enrich(batch)
    filtered = make_config(source_db, write_config, kafka.bootstrap, name="f.yaml", filter="action <> 'x'")
    plan = SinkPlan.build(filtered, filtered.sink("orders"))
    assert plan.needs_record
    via_arrow = run_arrow_stage(SinkPlan.build(config, config.sink("orders")), enriched).column("payload").to_pylist()
    with psycopg.connect(config.state_dsn) as conn:
        schemas = relations.relation_columns(conn, "cdc_pipeline")
    via_spark = run_stage(spark, plan, enriched, schemas).column("payload").to_pylist()
    assert via_arrow == via_spark  # byte for byte
    messages = [json.loads(p) for p in via_arrow]
    ada = {"id": None, "customer_name": 'Ada "A" é', "tier": "platinum", "since": "2026-01-01T22:04:05+00:00"}
    for m in messages:
        meta = m["metadata"]
        if meta["table_name"] == "customers":
            assert "enrichment" not in meta
            continue
        oid = m["record"]["id"]
        if oid in (3, 41):
            assert meta["enrichment"] is None, m
        elif oid % 2:  # customer 1 + oid % 2
            assert meta["enrichment"] == {"id": oid, "customer_name": "Bob", "tier": None, "since": None}
        else:
            assert meta["enrichment"] == {**ada, "id": oid}
    # The real delivery: the same messages reach the topic.
    stats = deliverer.run(until_idle=True)
    assert stats.delivered == len(messages) == 45
    got = {json.loads(r["value"])["record"]["id"]: json.loads(r["value"])["metadata"].get("enrichment")
           for r in kafka.records("orders", 45) if json.loads(r["value"])["metadata"]["table_name"] == "orders"}
    assert got[2]["tier"] == "platinum" and got[1]["customer_name"] == "Bob" and got[41] is None


def test_broken_query_is_an_outage_and_check_reports_it(
        source_db: Database, write_config: Callable[..., PipelineConfig], spark: Any, kafka: TansuBroker) -> None:
    seed(source_db)
    broken = ENRICH.replace("c.tier", "c.no_such_column")
    config = make_config(source_db, write_config, kafka.bootstrap, sql=broken)
    found = [f for f in check(config) if "enrichment" in f.subject]
    assert len(found) == 1 and found[0].level == "error" and "no_such_column" in found[0].message
    keyless = make_config(source_db, write_config, kafka.bootstrap, name="k.yaml",
                          sql="SELECT c.name FROM customers c WHERE c.id = ANY($1)")
    assert [f.message for f in check(keyless) if "enrichment" in f.subject] == [
        "the query must select the key columns of public.orders: missing id"]
    setup(config)
    source_db.execute("INSERT INTO customers VALUES (1, 'Ada', 'gold', NULL)")
    source_db.execute("INSERT INTO orders SELECT g, 1, 1 FROM generate_series(1, 10) g")
    drain(config)
    with pytest.raises(EnrichmentUnavailable, match="no_such_column"):
        Deliverer(config, config.sink("orders"), spark).run(until_idle=True)
    with psycopg.connect(config.state_dsn) as conn:  # nothing parked, nothing delivered: waiting
        assert conn.execute("SELECT count(*) FROM cdc_pipeline.failed_messages").fetchone() == (0,)
        assert conn.execute("SELECT coalesce(max(delivered), 0) FROM cdc_pipeline.sink_offsets").fetchone() == (0,)
    # A long-running delivery waits for it and records why; fixed, it delivers everything.
    waiting = Deliverer(config, config.sink("orders"), spark)
    runs: list[Any] = []
    thread = threading.Thread(target=lambda: runs.append(waiting.run(until_idle=False, seconds=120)))
    thread.start()
    try:  # a condition, not a 3 s run that a loaded machine may spend before its first attempt
        wait_until(lambda: waiting.stats is not None and waiting.stats.outage_retries >= 1, 60, "a retry")
    finally:
        waiting.stop()
        thread.join(60)
    [stats] = runs
    assert stats.outage_retries >= 1 and stats.delivered == 0
    fixed = make_config(source_db, write_config, kafka.bootstrap, name="fixed.yaml")
    stats = Deliverer(fixed, fixed.sink("orders"), spark).run(until_idle=True)
    assert stats.delivered == 11 and stats.parked == 0
    enrichments = [json.loads(r["value"])["metadata"].get("enrichment") for r in kafka.records("orders", 11)]
    assert sorted(e["id"] for e in enrichments if e) == list(range(1, 11))
    assert {e["customer_name"] for e in enrichments if e} == {"Ada"}


def test_composite_keys_pass_one_array_per_key_column(
        source_db: Database, write_config: Callable[..., PipelineConfig], spark: Any) -> None:
    source_db.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
    source_db.execute("CREATE TABLE orders (region text, n int, customer_id int, PRIMARY KEY (region, n))")
    sql = ("SELECT o.region, o.n, c.name FROM public.orders o JOIN public.customers c ON c.id = o.customer_id "
           "WHERE (o.region, o.n) IN (SELECT * FROM unnest($1::text[], $2::int[]))")
    config = make_config(source_db, write_config, "127.0.0.1:1", sql=sql)
    assert [f.level for f in check(config) if "enrichment" in f.subject] == ["ok"]
    setup(config)
    source_db.execute("INSERT INTO customers VALUES (1, 'Ada'), (2, 'Bob')")
    source_db.execute("""INSERT INTO orders VALUES ('e"u\\\\', 1, 1), ('e"u\\\\', 2, 2), ('us', 1, 2), ('{x,y}', 3, 9)""")
    drain(config)
    with psycopg.connect(config.state_dsn) as conn:
        batch = ChangeLog("cdc_pipeline").load_batch(conn, ["public.orders", "public.customers"], (0, -1), 1000)
    deliverer = DryRun(config, config.sink("orders"), spark)  # its plan and enricher, no sink
    out = run_arrow_stage(deliverer.plan, deliverer.enricher.enrich(batch))
    got = {tuple(m["record"][k] for k in ("region", "n")): m["metadata"]["enrichment"]
           for m in map(json.loads, out.column("payload").to_pylist()) if m["metadata"]["table_name"] == "orders"}
    assert got == {('e"u\\\\', 1): {"region": 'e"u\\\\', "n": 1, "name": "Ada"},
                   ('e"u\\\\', 2): {"region": 'e"u\\\\', "n": 2, "name": "Bob"},
                   ("us", 1): {"region": "us", "n": 1, "name": "Bob"}, ("{x,y}", 3): None}
    deliverer.enricher.close()
