"""A lake sink's maintenance job run through Dagster: it compacts the small files of four deliveries and
records on the sink's asset what the table holds (location, version or snapshot, row count, files), the
rows unchanged; a dry run only reads the figures; a table not written yet is named, not an error; the daily
schedule exists, stopped."""

from __future__ import annotations

from typing import Any

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, DefaultScheduleStatus

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.helpers import drain
from cdc_pipeline_tests.integration.sinks.test_sink_lake import deliver
from cdc_pipeline_tests.lake import lake_config, read_table


def _observed(result: Any) -> dict[str, Any]:
    [event] = [e for e in result.all_events if e.event_type == DagsterEventType.ASSET_OBSERVATION]
    observation = event.event_specific_data.asset_observation
    assert observation.asset_key == AssetKey(["sink", "lake"])
    return {k: v.value for k, v in observation.metadata.items()}


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_maintenance_job_compacts_and_records_the_table_on_the_sink(fmt, source_db, write_config, tmp_path):
    from cdc_pipeline.defs import build_definitions

    source_db.execute("CREATE TABLE ev (id int PRIMARY KEY, v int)")
    source_db.execute("CREATE TABLE later (id int PRIMARY KEY)")
    config = write_config(lake_config(source_db.dsn, ["public.ev", "public.later"], fmt, "append", tmp_path))
    setup(config)
    for i in range(4):  # four deliveries: four commits, four files at least
        source_db.execute("INSERT INTO ev SELECT g, %s FROM generate_series(%s::int, %s::int) g", (i, i * 5 + 1, i * 5 + 5))
        drain(config)
        deliver(config)
    defs = build_definitions(config.path)
    job = defs.resolve_job_def("maintain_lake_lake")
    [schedule] = [s for s in defs.schedules if s.name == "maintain_lake_lake_daily"]
    assert schedule.default_status == DefaultScheduleStatus.STOPPED
    op_config = {"ops": {"maintain_lake_lake_op": {"config": {"retain_hours": 0}}}}
    with DagsterInstance.ephemeral() as instance:
        seen = _observed(job.execute_in_process(instance=instance, run_config=op_config))
        [row] = seen["lake_tables"].records
        assert row.data["rows"] == 20 == seen["dagster/row_count"]
        assert row.data["files_after"] < row.data["files_before"] and row.data["files_before"] >= 4
        assert row.data["table"].endswith("ev") and row.data["location"].rstrip("/").endswith(row.data["table"].split(".")[-1])
        assert row.data["version_or_snapshot"] not in ("", "None")
        assert seen["tables_not_written_yet"].endswith("later")
        assert sorted(read_table(config, "public.ev").column("id").to_pylist()) == list(range(1, 21))

        source_db.execute("INSERT INTO ev VALUES (21, 9)")
        drain(config)
        deliver(config)
        dry = {"ops": {"maintain_lake_lake_op": {"config": {"dry_run": True}}}}
        [row] = _observed(job.execute_in_process(instance=instance, run_config=dry))["lake_tables"].records
        assert row.data["rows"] == 21 and row.data["files_after"] == row.data["files_before"]
