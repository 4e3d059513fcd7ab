"""Delta and Iceberg sinks through the real pipeline (drain, deliver), read back with deltalake / pyiceberg:
a mirror equals the source (upserts, deletes, key changes, unchanged TOAST values, TRUNCATE, an added
column); an append table holds every change once, in order; a redelivered batch is not written twice."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.delivery.engine import Deliverer
from cdc_pipeline.delivery.lazy_spark import LazySpark
from cdc_pipeline_tests.helpers import drain
from cdc_pipeline_tests.lake import by_key, lake_config, read_table

FORMATS = ["delta", "iceberg"]
BIG = "x" * 9000  # TOASTed: an update that leaves it alone carries no value for it


def deliver(config: Any) -> Any:
    return Deliverer(config, config.sink("lake"), LazySpark(config.spark)).run(until_idle=True)


def source_rows(dsn: str, sql: str) -> dict[Any, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return {r[0]: tuple(r) for r in conn.execute(sql).fetchall()}


@pytest.mark.parametrize("fmt", FORMATS)
def test_mirror_equals_the_source(fmt, source_db, write_config, tmp_path):
    source_db.execute("CREATE TABLE acct (id int PRIMARY KEY, ver bigint, note text, big text, tags text[])")
    config = write_config(lake_config(source_db.dsn, ["public.acct"], fmt, "mirror", tmp_path))
    setup(config)
    source_db.execute("INSERT INTO acct SELECT g, 1, 'n' || g, %s, ARRAY['a', g::text] FROM generate_series(1, 50) g",
                      (BIG,))
    drain(config)
    assert deliver(config).delivered == 50
    source_db.execute("UPDATE acct SET ver = 2, note = NULL WHERE id <= 10")  # `big` unchanged: not in the records
    source_db.execute("DELETE FROM acct WHERE id BETWEEN 11 AND 15")
    source_db.execute("UPDATE acct SET id = 1000 + id WHERE id BETWEEN 16 AND 18")  # key changes
    source_db.execute("INSERT INTO acct VALUES (2000, 1, 'late', 'small', NULL)")
    source_db.execute("ALTER TABLE acct ADD COLUMN extra numeric(12,3)")
    source_db.execute("UPDATE acct SET extra = 1.5, ver = 3 WHERE id = 2000")
    source_db.execute("UPDATE acct SET ver = 4 WHERE id = 1")  # twice in one batch, TOAST unchanged
    drain(config)
    deliver(config)
    cols = ["id", "ver", "note", "big", "tags", "extra"]
    got = by_key(read_table(config, "public.acct"), "id", cols)
    want = source_rows(source_db.dsn, f"SELECT {', '.join(cols)} FROM acct")
    assert got == want

    source_db.execute("INSERT INTO acct (id, ver) VALUES (3000, 1)")
    source_db.execute("TRUNCATE acct")
    source_db.execute("INSERT INTO acct (id, ver, big) VALUES (3001, 1, 'after')")
    drain(config)
    deliver(config)
    assert by_key(read_table(config, "public.acct"), "id", ["id", "ver", "big"]) == {3001: (3001, 1, "after")}


@pytest.mark.parametrize("fmt", FORMATS)
def test_append_holds_every_change_once(fmt, source_db, write_config, tmp_path):
    source_db.execute("CREATE TABLE ev (id int PRIMARY KEY, v text)")
    config = write_config(lake_config(source_db.dsn, ["public.ev"], fmt, "append", tmp_path))
    setup(config)
    source_db.execute("INSERT INTO ev SELECT g, 'v' || g FROM generate_series(1, 30) g")
    source_db.execute("UPDATE ev SET v = 'u' WHERE id <= 5")
    source_db.execute("DELETE FROM ev WHERE id > 25")
    drain(config)
    assert deliver(config).delivered == 40
    table = read_table(config, "public.ev").sort_by([("commit_lsn", "ascending"), ("commit_idx", "ascending")])
    assert table.num_rows == 40
    assert len(set(table.column("idempotency_key").to_pylist())) == 40
    actions = table.column("action").to_pylist()
    assert actions == ["insert"] * 30 + ["update"] * 5 + ["delete"] * 5
    assert table.column("v").to_pylist()[30:35] == ["u"] * 5
    assert table.column("id").to_pylist()[35:] == [26, 27, 28, 29, 30]
    assert {"commit_timestamp", "commit_date", "changes"} <= set(table.column_names)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("mode", ["mirror", "append"])
def test_a_redelivered_batch_is_not_written_twice(fmt, mode, source_db, write_config, tmp_path):
    """The state's offset is left behind (as by a crash after the table's commit): the next run hands the
    sink the same messages again, and the table's own marks make it skip them."""
    source_db.execute("CREATE TABLE ev (id int PRIMARY KEY, v int)")
    config = write_config(lake_config(source_db.dsn, ["public.ev"], fmt, mode, tmp_path))
    setup(config)
    source_db.execute("INSERT INTO ev SELECT g, 0 FROM generate_series(1, 20) g")
    source_db.execute("UPDATE ev SET v = v + 1")
    drain(config)
    deliver(config)
    with psycopg.connect(config.state_dsn) as conn:
        conn.execute("DELETE FROM cdc_pipeline.sink_offsets WHERE sink = 'lake'")
    deliver(config)
    table = read_table(config, "public.ev")
    if mode == "append":
        assert table.num_rows == 40
    else:
        assert by_key(table, "id", ["id", "v"]) == {i: (i, 1) for i in range(1, 21)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_maintenance_compacts_and_keeps_the_marks(fmt, source_db, write_config, tmp_path):
    """Many small commits compacted into fewer files, old snapshots / files removed; the rows are the same and
    the sink's marks survive (a redelivery after it still writes nothing twice)."""
    from cdc_pipeline.sinks.lake.maintain import main, maintain

    source_db.execute("CREATE TABLE ev (id int PRIMARY KEY, v int)")
    config = write_config(lake_config(source_db.dsn, ["public.ev"], fmt, "append", tmp_path))
    setup(config)
    for i in range(4):  # four deliveries: four commits, four files at least
        source_db.execute("INSERT INTO ev SELECT g, %s FROM generate_series(%s::int, %s::int) g", (i, i * 10 + 1, i * 10 + 10))
        drain(config)
        deliver(config)
    [report] = maintain(config, "lake", retain_hours=0)
    assert report["rows"] == 40 and report["files_before"] >= 4 and report["files_after"] < report["files_before"]
    assert read_table(config, "public.ev").num_rows == 40
    with psycopg.connect(config.state_dsn) as conn:
        conn.execute("DELETE FROM cdc_pipeline.sink_offsets WHERE sink = 'lake'")
    deliver(config)
    assert sorted(read_table(config, "public.ev").column("id").to_pylist()) == list(range(1, 41))
    assert main(["--config", config.path, "--sink", "nope"]) == 2
