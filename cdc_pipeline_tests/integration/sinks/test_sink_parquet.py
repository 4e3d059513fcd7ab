"""Parquet sink through real Spark: partitioned by table and date; a retried batch replaces its files."""

from __future__ import annotations

import json
from types import SimpleNamespace

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.sinks.base import OutboundMessage
from cdc_pipeline.sinks.parquet.client import ParquetSink
from cdc_pipeline_tests.helpers import deliver, drain


def _msg(lsn: int, idx: int, table: str, n: int) -> OutboundMessage:
    body = {"record": {"id": n}, "changes": None, "action": "insert",
            "metadata": {"table_schema": "public", "table_name": table,
                         "commit_timestamp": "2026-11-21T10:00:00.000000Z", "commit_lsn": lsn, "commit_idx": idx,
                         "idempotency_key": f"{lsn}:{idx}"}}
    return OutboundMessage(f"{lsn}:{idx}", None, None, json.dumps(body).encode())


def test_retried_batch_replaces_its_own_files(tmp_path, spark):
    sink = ParquetSink(SimpleNamespace(name="pq", destination=SimpleNamespace(path=str(tmp_path / "out"))))
    batch = [_msg(100, i, "a" if i % 2 else "b", i) for i in range(10)]
    assert sink.deliver(batch[:6]) == [None] * 6
    assert sink.deliver(batch) == [None] * 10  # the retry after a crash: same first position, more rows
    df = spark.read.parquet(str(tmp_path / "out"))
    rows = df.select("idempotency_key", "table", "date").collect()
    assert sorted(r[0] for r in rows) == sorted(f"100:{i}" for i in range(10))  # no duplicates
    assert {r[1] for r in rows} == {"public.a", "public.b"} and {str(r[2]) for r in rows} == {"2026-11-21"}
    assert (tmp_path / "out" / "table=public.a" / "date=2026-11-21" / "batch=100_0").is_dir()


def test_pipeline_to_parquet(source_db, write_config, spark, tmp_path):
    source_db.execute("CREATE TABLE ev (id int PRIMARY KEY, v text)")
    config = write_config({
        "source": {"dsn": source_db.dsn, "slot": "pq", "publication": "pq"},
        "drain": {"heartbeat_seconds": 1, "batch_ms": 200},
        "tables": [{"name": "public.ev"}],
        "sinks": [{"name": "lake", "tables": ["public.ev"],
                   "destination": {"type": "parquet", "path": f"file://{tmp_path}/lake"}}],
    })
    setup(config)
    source_db.execute("INSERT INTO ev SELECT g, 'v' || g FROM generate_series(1, 100) g")
    source_db.execute("DELETE FROM ev WHERE id <= 10")
    drain(config)
    stats = deliver(config, spark, sink="lake")
    assert stats.delivered == 110
    got = spark.read.parquet(f"file://{tmp_path}/lake").orderBy("commit_lsn", "commit_idx").collect()
    assert [r["action"] for r in got].count("delete") == 10
    first = json.loads(got[0]["message"])
    assert set(first) == {"record", "changes", "action", "metadata"} and first["record"] == {"id": 1, "v": "v1"}
