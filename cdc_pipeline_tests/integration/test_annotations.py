"""Transaction annotations: pg_logical_emit_message(true, 'cdc_pipeline:annotations', <json object>) inside a
transaction puts the object into metadata.annotations of its changes logged after it, on both stages."""

from __future__ import annotations

import json
import logging

import psycopg
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest
from cdc_pipeline.capture import annotations
from cdc_pipeline.delivery.arrow_stage import run_arrow_stage
from cdc_pipeline.delivery.plan import SinkPlan
from cdc_pipeline.delivery.spark_stage import run_stage
from cdc_pipeline.state.store import Store
from cdc_pipeline_tests.helpers import drain, mirror_config
from cdc_pipeline_tests.integration.test_backfill import drain_running

EMIT = "SELECT pg_logical_emit_message(true, 'cdc_pipeline:annotations', %s)"


def _messages(config, spark) -> list[dict]:  # type: ignore[no-untyped-def]
    with psycopg.connect(config.state_dsn) as conn:
        batch = Store("cdc_pipeline").load_batch(conn, ["public.t"], (0, -1), 1000)
    plan = SinkPlan.build(config, config.sink("mirror"))
    via_arrow = run_arrow_stage(plan, batch).column("payload").to_pylist()
    via_spark = run_stage(spark, plan, batch, {}).column("payload").to_pylist()
    assert via_arrow == via_spark  # byte for byte, annotated or not
    return [json.loads(p) for p in via_arrow]


@pytest.mark.pg_matrix
def test_annotated_transactions_carry_their_object_and_bad_ones_are_ignored(
        source_db, db_factory, write_config, spark, caplog):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"]))
    setup(config)
    note = {"user": "ada", "why": "refund é\"\\", "request": 42, "n": 1.50, "tags": ["a", None]}
    with source_db.connect() as conn:
        conn.execute("INSERT INTO t VALUES (1, 'before')")  # plain transaction: no annotation
        with conn.transaction():
            conn.execute("INSERT INTO t VALUES (2, 'early')")  # before the message: none
            conn.execute(EMIT, (json.dumps(note),))
            conn.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(3, 5) g")
            conn.execute("UPDATE t SET v = 'y' WHERE id = 3")
            conn.execute("DELETE FROM t WHERE id = 4")
        with conn.transaction():  # malformed ones: logged, ignored, the drain goes on
            for bad in ('{"unterminated": ', '[1, 2]', '{"nan": NaN}', '{"nul": "a\\u0000b"}', '{"s": "\\ud800"}'):
                conn.execute(EMIT, (bad,))
            conn.execute("INSERT INTO t VALUES (6, 'bad notes')")
        conn.execute("SELECT pg_logical_emit_message(true, 'cdc_pipeline:annotations', %s::bytea)",
                     (b"\xff\xfe",))  # not UTF-8, outside a transaction block of ours: its own transaction
        with conn.transaction():  # a later annotation replaces the earlier one for changes after it
            conn.execute(EMIT, ('{"step": 1}',))
            conn.execute("INSERT INTO t VALUES (7, 'one')")
            conn.execute(EMIT, ('{"step": 2}',))
            conn.execute(EMIT, ("not json",))  # refused: the one in force stays
            conn.execute("INSERT INTO t VALUES (8, 'two')")
        conn.execute("INSERT INTO t VALUES (9, 'after')")
    with caplog.at_level(logging.WARNING, logger="cdc_pipeline.capture.drain"):
        stats = drain(config)
    assert stats.changes == 11
    refused = [r.getMessage() for r in caplog.records if "ignored the annotation" in r.getMessage()]
    assert len(refused) == 7, refused
    assert not any("unterminated" in m or "ud800" in m for m in refused)  # never the content itself
    by_id = {(m["record"]["id"], m["action"]): m["metadata"] for m in _messages(config, spark)}
    assert len(by_id) == 11
    carried = {k: meta.get("annotations") for k, meta in by_id.items()}
    assert carried == {
        (1, "insert"): None, (2, "insert"): None,
        (3, "insert"): note, (4, "insert"): note, (5, "insert"): note, (3, "update"): note, (4, "delete"): note,
        (6, "insert"): None, (7, "insert"): {"step": 1}, (8, "insert"): {"step": 2}, (9, "insert"): None,
    }
    assert sum(1 for meta in by_id.values() if "annotations" not in meta) == 4  # no key where none


def test_backfill_reads_carry_no_annotation(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    source_db.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 20) g")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"]))
    setup(config)
    with source_db.connect() as conn, conn.transaction():
        conn.execute(EMIT, ('{"who": "ops"}',))
        conn.execute("UPDATE t SET v = 'y' WHERE id = 1")
    with drain_running(config):  # the backfill's watermarks are reconciled by a running drain
        Backfiller(config, BackfillRequest("public.t")).run()
    drain(config)
    messages = _messages(config, spark)
    reads = [m for m in messages if m["action"] == "read"]
    assert len(reads) == 20 and all("annotations" not in m["metadata"] for m in reads)
    assert [m["metadata"]["annotations"] for m in messages if m["action"] == "update"] == [{"who": "ops"}]


@pytest.mark.parametrize("content, ok", [
    (b'{"a": 1}', True), (b'{"big": 1e400}', True), (b"[]", False), (b'"s"', False), (b"{", False),
    (b'{"x": Infinity}', False), (b'{"x": 1e999999}', False), (b'{"\\u0000": 1}', False), (b"\xff", False),
    (b"[" * 100000 + b"]" * 100000, False),
])
def test_parse_accepts_only_what_jsonb_stores(content, ok):
    text, refused = annotations.parse(content)
    assert (text is not None) is ok and (refused is None) is ok
