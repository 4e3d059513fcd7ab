"""The Arrow path (sinks with nothing for Spark to compute) must produce exactly the Spark stage's output."""

from __future__ import annotations

import json

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.delivery.arrow_stage import run_arrow_stage
from cdc_pipeline.delivery.plan import SinkPlan
from cdc_pipeline.delivery.spark_stage import run_stage
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline_tests.helpers import drain, mirror_config


def test_arrow_and_spark_stages_agree_byte_for_byte(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE odd (id text PRIMARY KEY, v jsonb, n numeric, t timestamptz)")
    source_db.execute("CREATE TABLE plain (a int, b int, PRIMARY KEY (a, b))")
    source_db.execute("ALTER TABLE odd REPLICA IDENTITY FULL")
    for grouping in (True, False):
        data = mirror_config(source_db.dsn, dest.dsn, ["public.plain", "public.odd"], message_grouping=grouping)
        data["sinks"][0]["actions"] = ["insert", "delete"]
        config = write_config(data, name=f"cdc_{grouping}.yaml")
        if grouping:
            setup(config)
            source_db.execute("INSERT INTO odd VALUES (%s, %s, 1.50, '2026-01-02 03:04:05+00'), "
                              "('b', NULL, NULL, '2026-01-02 03:04:05.000001+00')", ('é"\\|\n', '{"x": [1, null]}'))
            source_db.execute("UPDATE odd SET n = 2 WHERE id = 'b'")
            source_db.execute("INSERT INTO plain SELECT g, g FROM generate_series(1, 50) g")
            source_db.execute("UPDATE plain SET b = b + 100 WHERE a < 5")
            source_db.execute("DELETE FROM plain WHERE a > 45")
            source_db.execute("TRUNCATE plain")
            drain(config)
        with psycopg.connect(config.state_dsn) as conn:
            batch = ChangeLog("cdc_pipeline").load_batch(conn, ["public.plain", "public.odd"], (0, -1), 1000)
        plan = SinkPlan.build(config, config.sink("mirror"))
        assert not plan.needs_record
        via_arrow = run_arrow_stage(plan, batch)
        via_spark = run_stage(spark, plan, batch, {})
        assert via_arrow.num_rows == via_spark.num_rows > 50
        for column in ("commit_lsn", "commit_idx", "group_key", "route", "payload"):
            assert via_arrow.column(column).to_pylist() == via_spark.column(column).to_pylist(), column
        for payload in via_arrow.column("payload").to_pylist():
            json.loads(payload)
