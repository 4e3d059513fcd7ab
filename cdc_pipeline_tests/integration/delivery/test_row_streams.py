"""Row streams (`stream: rows`): coalescing, deletes on and off, backfill reads, a row-stream mirror."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, mirror_config
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill


def append_sink(name: str, dsn: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "tables": ["public.t"], "stream": "rows",
            "destination": {"type": "postgres", "dsn": dsn, "table": f"out.{name}", "mode": "append"}, **kw}


def messages(dsn: str, table: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute(f"SELECT message FROM out.{table} ORDER BY commit_lsn, commit_idx")]


def test_rows_coalesced_per_batch_deletes_off_and_on(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, n numeric)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    data["sinks"] = [append_sink("plain", dest.dsn), append_sink("with_deletes", dest.dsn, deletes=True),
                     {**append_sink("changes", dest.dsn), "stream": "changes"}]
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO t VALUES (1, 'a', 1.10), (2, 'b', 2), (3, 'c', 12345678901234567890.123456789)")
    source_db.execute("UPDATE t SET v = 'a2' WHERE id = 1")
    source_db.execute("UPDATE t SET v = 'a3', n = 0.1 WHERE id = 1")
    source_db.execute("DELETE FROM t WHERE id = 2")
    source_db.execute("INSERT INTO t VALUES (4, 'd', NULL)")
    source_db.execute("DELETE FROM t WHERE id = 4")
    drain(config)
    for sink in ("plain", "with_deletes", "changes"):
        deliver(config, spark, sink=sink)

    plain = messages(dest.dsn, "plain")
    assert [m["record"] for m in plain] == [
        {"id": 3, "v": "c", "n": 12345678901234567890.123456789}, {"id": 1, "v": "a3", "n": 0.1}]
    for m in plain:
        assert set(m) == {"record", "metadata"}
        assert m["metadata"]["table_name"] == "t" and ":" in m["metadata"]["idempotency_key"]
    # Digit for digit: the row's numeric went through reshaping as text, not a float.
    with psycopg.connect(dest.dsn) as conn:
        raw = conn.execute("SELECT message->'record'->>'n' FROM out.plain WHERE message->'record'->>'id' = '3'").fetchone()
    assert raw == ("12345678901234567890.123456789",)

    with_deletes = messages(dest.dsn, "with_deletes")
    assert [(m["record"], m.get("deleted", False)) for m in with_deletes] == [
        ({"id": 3, "v": "c", "n": 12345678901234567890.123456789}, False), ({"id": 1, "v": "a3", "n": 0.1}, False),
        ({"id": 2}, True), ({"id": 4}, True)]
    assert all("action" not in m and "changes" not in m for m in with_deletes)
    # The change stream of the same log still has every change.
    assert [m["action"] for m in messages(dest.dsn, "changes")] == [
        "insert", "insert", "insert", "update", "update", "delete", "insert", "delete"]


def test_backfill_reads_arrive_in_row_shape(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    source_db.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 25) g")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    data["sinks"] = [append_sink("rows", dest.dsn)]
    data["backfill"] = {"initial_page_size": 10, "max_page_size": 10}
    config = write_config(data)
    setup(config)
    assert backfill(config, "public.t", sinks=["rows"]).status == "completed"
    drain(config)
    deliver(config, spark, sink="rows")
    got = messages(dest.dsn, "rows")
    assert sorted(m["record"]["id"] for m in got) == list(range(1, 26))
    assert all(set(m) == {"record", "metadata"} and m["record"]["v"] == f"v{m['record']['id']}" for m in got)
    assert all(m["metadata"]["backfill_id"] for m in got)


def test_row_stream_mirror_equals_source_after_churn(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, n int)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"], target="mirror.t", stream="rows", deletes=True,
                         batch_size=37)  # small batches: a row's changes coalesce within and across them
    config = write_config(data)
    setup(config)
    rng = random.Random(13)
    with source_db.connect() as conn:
        for step in range(600):
            i = rng.randrange(1, 120)
            op = rng.random()
            if op < 0.45:
                conn.execute("INSERT INTO t VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v, "
                             "n = t.n + 1", (i, f"v{step}", step))
            elif op < 0.8:
                conn.execute("UPDATE t SET n = n + %s, v = v || 'x' WHERE id = %s", (step, i))
            else:
                conn.execute("DELETE FROM t WHERE id = %s", (i,))
            if step == 300:
                drain(config)
                deliver(config, spark)
                assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t")
    drain(config)
    stats = deliver(config, spark)
    assert stats.filtered > 0  # coalesced changes are not sent
    assert assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t") > 20
    print(json.dumps(stats.as_metadata()))


def test_a_toasted_value_set_by_a_coalesced_change_reaches_the_row_stream(source_db, db_factory, write_config,
                                                                         spark):
    """An update sets a TOASTed column, a later one in the same batch leaves it unchanged (absent from its
    record): the coalesced row carries the value the dropped change set, to a mirror and to a consumer."""
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text, big text)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"], target="mirror.t", stream="rows")
    data["sinks"].append(append_sink("rows", dest.dsn))
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO t VALUES (1, 'a', 'small'), (2, 'b', 'small')")
    drain(config)
    for sink in ("mirror", "rows"):
        deliver(config, spark, sink=sink)
    # Out of line (TOASTed): 32 kB of hex digits do not compress below the 2 kB threshold.
    source_db.execute("UPDATE t SET big = (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 1000) g) "
                      "WHERE id = 1")
    source_db.execute("UPDATE t SET v = 'a2' WHERE id = 1")
    source_db.execute("INSERT INTO t VALUES (3, 'c', 'small'); UPDATE t SET v = 'c2' WHERE id = 3")
    drain(config)
    with psycopg.connect(config.state_dsn) as conn:  # the premise: the last update's record lacks `big`
        last = conn.execute("SELECT record ? 'big' FROM cdc_pipeline.change_log WHERE pk = '[1]' "
                            "ORDER BY commit_lsn DESC, commit_idx DESC LIMIT 1").fetchone()
    assert last == (False,)
    for sink in ("mirror", "rows"):
        assert deliver(config, spark, sink=sink).filtered > 0  # coalesced
    digests = "SELECT id, v, md5(big) FROM {} ORDER BY id"
    expected = source_db.execute(digests.format("t"))
    with psycopg.connect(dest.dsn) as conn:
        assert conn.execute(digests.format("mirror.t")).fetchall() == expected
    [row] = [m["record"] for m in messages(dest.dsn, "rows") if m["record"]["id"] == 1 and m["record"]["v"] == "a2"]
    assert "big" in row and hashlib.md5(row["big"].encode()).hexdigest() == expected[0][2]
