"""A transform that fails on one message parks that message (and its group), not the batch."""

from __future__ import annotations

import json

import psycopg

from cdc_pipeline.setup import setup
from cdc_pipeline_tests.helpers import deliver, drain


def test_transform_error_on_one_row_parks_only_its_group(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE items (id int PRIMARY KEY, qty int)")
    config = write_config({
        "source": {"dsn": source_db.dsn, "slot": "iso", "publication": "iso"},
        "drain": {"heartbeat_seconds": 1, "batch_ms": 200},
        "tables": [{"name": "public.items"}],
        "sinks": [{
            "name": "log", "tables": ["public.items"],
            # ANSI division by zero for item 13 only: a real per-row runtime failure in Spark.
            "transform": {"id": "record.id", "ratio": "100 / (record.id - 13)", "action": "action"},
            "backoff": {"initial_ms": 60000, "max_ms": 60000},
            "destination": {"type": "postgres", "dsn": dest.dsn, "table": "out.items", "mode": "append"},
        }],
    })
    setup(config)
    source_db.execute("INSERT INTO items SELECT g, 1 FROM generate_series(1, 40) g")
    source_db.execute("UPDATE items SET qty = 2")
    drain(config)
    stats = deliver(config, spark, sink="log")
    assert stats.parked == 2  # item 13's insert failed; its update is held behind it
    with psycopg.connect(dest.dsn) as conn:
        got = [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in conn.execute(
            "SELECT message FROM out.items ORDER BY commit_lsn, commit_idx").fetchall()]
    assert sorted({m["id"] for m in got}) == [i for i in range(1, 41) if i != 13]
    assert len(got) == 78
    with psycopg.connect(config.state_dsn) as conn:
        parked = conn.execute("SELECT attempts, last_error FROM cdc_pipeline.failed_messages "
                              "ORDER BY commit_lsn, commit_idx").fetchall()
    assert parked[0][0] == 1 and "transform failed" in parked[0][1] and "DIVIDE_BY_ZERO" in parked[0][1]
    assert parked[1][0] == 0 and "held behind" in parked[1][1]
