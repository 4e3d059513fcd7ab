"""Backfill assets through Dagster's own APIs: a partition backfills exactly its window; a run whose
backfill fails for real (its connections are killed) keeps the checkpoint, and the retry resumes from it.
The drain runs in a background thread, as the drain sensor would alongside the run."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from dagster import AssetKey, DagsterEventType, DagsterInstance, build_schedule_context

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.defs.backfill import CHECK_NAME, backfill_job_name
from cdc_pipeline.defs.tags import BACKFILL_TAGS
from cdc_pipeline.state.backfills import BackfillStore
from cdc_pipeline_tests.helpers import deliver, rows
from cdc_pipeline_tests.integration.backfill.test_backfill import backfill_config, drain_running, log_reads


def _defs(path: Path):  # type: ignore[no-untyped-def]
    from cdc_pipeline.defs import build_definitions

    return build_definitions(str(path))


def test_materializing_a_partition_backfills_exactly_its_window(source_db, db_factory, write_config, tmp_path,
                                                                spark):
    dest = db_factory()
    source_db.execute(
        "CREATE TABLE public.events (id int PRIMARY KEY, created_at timestamptz, kind text);"
        "CREATE INDEX ON public.events (created_at);"
        # 6 days of rows, every 11th without a timestamp; rows right on the day boundaries included
        "INSERT INTO public.events SELECT g, CASE WHEN g % 11 = 0 THEN NULL ELSE "
        "'2025-01-01 00:00:00+00'::timestamptz + (g % 144) * interval '1 hour' END, 'k' FROM generate_series(1, 2000) g")
    table = {"name": "public.events", "sort_column": "created_at",
             "partitions": {"kind": "daily", "start": "2025-01-01"}}
    config = write_config(backfill_config(source_db.dsn, dest.dsn, [table],
                                          {"initial_page_size": 50, "max_page_size": 100}))
    setup(config)
    defs = _defs(tmp_path / "cdc.yaml")
    job = defs.resolve_job_def("backfill_public_events")
    assert job.partitions_def is not None and "2025-01-03" in job.partitions_def.get_partition_keys()
    with DagsterInstance.ephemeral() as instance, drain_running(config):
        result = job.execute_in_process(instance=instance, partition_key="2025-01-03")
        assert result.success
        run = instance.get_run_by_id(result.run_id)
        assert run is not None and run.tags.get("cdc_pipeline/kind") == "backfill"
        assert run.tags.get("dagster/partition") == "2025-01-03"
        [mat] = [e.materialization for e in result.get_asset_materialization_events()]
        assert mat.partition == "2025-01-03"
        checks = result.get_asset_check_evaluations()
        assert [(c.check_name, c.passed) for c in checks] == [(CHECK_NAME, True)]
        # The check reports this run's own backfill and partition; the run and the backfill name each other.
        own = mat.metadata["backfill_id"].value
        assert checks[0].metadata["backfill_id"].value == own and checks[0].metadata["partition"].value == "2025-01-03"
        assert checks[0].metadata["dagster_run_id"].value == result.run_id
        assert instance.get_run_by_id(result.run_id).tags["cdc_pipeline/backfill_id"] == own
        assert mat.metadata["dagster/row_count"].value == mat.metadata["rows_emitted"].value
        # A later partition's backfill does not become this partition's: its check, executed by hand for
        # 2025-01-03 (a run with no backfill of its own), still reports the 2025-01-03 backfill.
        later = job.execute_in_process(instance=instance, partition_key="2025-01-04")
        [later_check] = later.get_asset_check_evaluations()
        assert later_check.metadata["backfill_id"].value not in (own, None)
        check_job = defs.resolve_implicit_global_asset_job_def().get_subset(
            asset_selection=set(), asset_check_selection={checks[0].asset_check_key})
        [by_hand] = check_job.execute_in_process(instance=instance, partition_key="2025-01-03"
                                                 ).get_asset_check_evaluations()
        assert by_hand.metadata["backfill_id"].value == own and by_hand.passed
    expected = sorted(f"[{r[0]}]" for r in source_db.execute(
        "SELECT id FROM public.events WHERE created_at >= '2025-01-03 00:00:00+00' "
        "AND created_at < '2025-01-04 00:00:00+00'"))
    backfill_id = mat.metadata["backfill_id"].value
    assert sorted(log_reads(config, backfill_id)) == expected  # the day, both edges right, no NULLs
    assert mat.metadata["rows_read"].value == len(expected) and mat.metadata["status"].value == "completed"
    deliver(config, spark)
    both_days = sorted(f"[{r[0]}]" for r in source_db.execute(
        "SELECT id FROM public.events WHERE created_at >= '2025-01-03 00:00:00+00' "
        "AND created_at < '2025-01-05 00:00:00+00'"))
    assert sorted(f"[{r['id']}]" for r in rows(dest.dsn, "mirror.events")) == both_days

    # The schedule re-runs the partition that just ended.
    schedule = defs.get_schedule_def("backfill_public_events_previous_partition")
    with DagsterInstance.ephemeral() as instance:
        ctx = build_schedule_context(instance=instance,
                                     scheduled_execution_time=datetime(2025, 1, 6, 0, 5, tzinfo=UTC))
        [request] = schedule.evaluate_tick(ctx).run_requests
    assert request.partition_key == "2025-01-05"
    assert request.tags.get("cdc_pipeline/kind") == "backfill"


def test_integer_partitions_of_a_sequence_column(source_db, db_factory, write_config, tmp_path):
    dest = db_factory()
    source_db.execute("CREATE TABLE public.seq (id int PRIMARY KEY, v text)")
    source_db.execute("INSERT INTO public.seq SELECT g, 'v' FROM generate_series(1, 1999) g")
    table = {"name": "public.seq", "sort_column": "id", "partitions": {"kind": "integer", "start": 0, "end": 2000,
                                                                        "step": 500}}
    config = write_config(backfill_config(source_db.dsn, dest.dsn, [table]))
    setup(config)
    defs = _defs(tmp_path / "cdc.yaml")
    job = defs.resolve_job_def("backfill_public_seq")
    assert job.partitions_def.get_partition_keys() == ["0..500", "500..1000", "1000..1500", "1500..2000"]
    with DagsterInstance.ephemeral() as instance, drain_running(config):
        result = job.execute_in_process(instance=instance, partition_key="500..1000")
    assert result.success
    [mat] = [e.materialization for e in result.get_asset_materialization_events()]
    assert sorted(log_reads(config, mat.metadata["backfill_id"].value)) == sorted(
        f"[{i}]" for i in range(500, 1000))
    assert [s.name for s in defs.schedules or []] == []  # integer partitions have no "previous" one


def test_killed_sessions_mid_run_are_ridden_through_from_the_checkpoint(source_db, db_factory, write_config, tmp_path):
    dest = db_factory()
    source_db.execute("CREATE TABLE public.big (id int PRIMARY KEY, v text)")
    source_db.execute("INSERT INTO public.big SELECT g, md5(g::text) FROM generate_series(1, 20000) g")
    data = backfill_config(source_db.dsn, dest.dsn, ["public.big"],
                           {"initial_page_size": 500, "max_page_size": 500, "max_staged_pages": 2})
    data["sinks"].append({"name": "other", "tables": ["public.big"],
                          "destination": {"type": "postgres", "dsn": dest.dsn, "table": "other.big"}})
    config = write_config(data)
    setup(config)
    defs = _defs(tmp_path / "cdc.yaml")
    job = defs.resolve_job_def(backfill_job_name(config.tables[0]))
    asset = defs.resolve_assets_def(AssetKey(["cdc", "snapshot", "public", "big_snapshot"]))
    store = BackfillStore("cdc_pipeline")
    killed: dict[str, int] = {}

    def kill_after_some_pages() -> None:
        # A real failure: the backfill's own connections are terminated mid-run, once.
        with psycopg.connect(config.state_dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                infos = store.list(conn)
                if infos and infos[0].pages >= 5:
                    killed["checkpoint_pages"] = infos[0].pages
                    conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                 "WHERE application_name = 'cdc_pipeline.backfill'")
                    return
                time.sleep(0.01)

    killer = threading.Thread(target=kill_after_some_pages)
    with DagsterInstance.ephemeral() as instance, drain_running(config):
        killer.start()
        result = job.execute_in_process(instance=instance, run_config={
            "ops": {asset.node_def.name: {"config": {"sinks": ["mirror"]}}}})
        killer.join()
        assert "checkpoint_pages" in killed, "the backfill finished before its connections were killed"
        assert result.success
        tags = instance.get_run_by_id(result.run_id).tags  # what the sensors and tag limits key on
        assert tags.get("cdc_pipeline/kind") == BACKFILL_TAGS["cdc_pipeline/kind"] == "backfill", tags
        # The backfill rides through its lost sessions itself (reconnecting with the drain's backoff and going
        # on from its checkpoint): no step retry is needed.
        kinds = [e.event_type for e in result.all_events]
        assert DagsterEventType.STEP_UP_FOR_RETRY not in kinds
    [mat] = [e.materialization for e in result.get_asset_materialization_events()]
    meta = {k: v.value for k, v in mat.metadata.items()}
    assert meta["status"] == "completed" and meta["sinks"] == "mirror"
    assert meta["rows_read"] == 20000
    with psycopg.connect(config.state_dsn, autocommit=True) as conn:
        (info,) = store.list(conn)
    assert info.page_attempts <= len(range(0, 20000, 500)) + 1 + 1  # at most the page in flight read twice
    assert sorted(log_reads(config, info.id)) == sorted(f"[{i}]" for i in range(1, 20001))
