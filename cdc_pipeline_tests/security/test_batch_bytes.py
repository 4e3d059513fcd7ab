"""Delivery batches are capped by bytes as well as rows (issue 15.9): very large rows make many small batches,
never one huge one, and are delivered exactly."""

from __future__ import annotations

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, mirror_config


def test_large_rows_split_into_byte_capped_batches(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE big (id int PRIMARY KEY, blob text)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.big"])
    data["delivery"] = {"batch_bytes": 3_000_000}
    config = write_config(data)
    assert config.delivery.batch_bytes == 3_000_000
    setup(config)
    source_db.execute("INSERT INTO big SELECT g, repeat(md5(g::text), 31250) FROM generate_series(1, 13) g")  # 1 MB each
    source_db.execute("TRUNCATE big")  # a message without a record: never lost to the byte count
    source_db.execute("INSERT INTO big SELECT g, repeat(md5(g::text), 31250) FROM generate_series(1, 12) g")
    drain(config)
    with psycopg.connect(config.state_dsn) as conn:
        sizes = [ChangeLog("cdc_pipeline").load_batch(conn, ["public.big"], (0, -1), 1000, max_bytes=m).num_rows
                 for m in (3_000_000, 1, 10**9)]
    assert sizes == [3, 1, 26]  # the message that crosses the cap is the batch's last; at least one always
    stats = deliver(config, spark)
    assert stats.batches >= 9 and stats.delivered == 26
    assert assert_mirrored(source_db.dsn, "public.big", dest.dsn, "mirror.big") == 12
