"""Materialize is safe on every asset (defs/materialize.py), through the implicit asset job a click runs:
on a streaming asset whose stream runs, the run ends at once, successfully, recording nothing, tagged never
to be retried, and no second stream starts; with no stream it catches up and ends; "Materialize all"
backfills nothing."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from dagster import AssetKey, DagsterEventType, DagsterInstance

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.delivery.engine import Deliverer
from cdc_pipeline.state.backfills import BackfillStore
from cdc_pipeline_tests.helpers import mirror_config, rows, wait_until
from cdc_pipeline_tests.integration.backfill.test_backfill import drain_running

LOG, SINK = AssetKey(["cdc", "change_log"]), AssetKey(["sink", "mirror"])
SNAPSHOT = AssetKey(["cdc", "snapshot", "public", "t_snapshot"])


def _defs(path: Path) -> Any:
    from cdc_pipeline.defs import build_definitions

    return build_definitions(str(path))


def click(defs: Any, instance: DagsterInstance, keys: set[AssetKey]) -> Any:
    """What Materialize (or Materialize all) launches: `__ASSET_JOB` with the selected assets."""
    job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection=keys)
    return job.execute_in_process(instance=instance, raise_on_error=False)


def _log(instance: DagsterInstance, run_id: str) -> str:
    return "\n".join(e.user_message for e in instance.all_logs(run_id))


def _prepare(source_db, db_factory, write_config) -> Any:  # type: ignore[no-untyped-def]
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
    config = write_config({**mirror_config(source_db.dsn, dest.dsn, ["public.t"]),
                           "delivery": {"idle_seconds": 0.05}})
    setup(config)
    return config, dest


def test_materialize_on_running_streams_ends_at_once(source_db, db_factory, write_config, tmp_path, spark):
    config, _ = _prepare(source_db, db_factory, write_config)
    defs = _defs(tmp_path / "cdc.yaml")
    deliverer = Deliverer(config, config.sink("mirror"), spark)
    errors: list[BaseException] = []

    def deliver() -> None:
        try:
            deliverer.run(until_idle=False, seconds=600)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=deliver, daemon=True)
    with DagsterInstance.ephemeral() as instance, drain_running(config):
        worker.start()
        try:
            wait_until(lambda: _sink_locked(config), 60, "the sink's lock")
            for key, says in ((LOG, "the drain already streams (another process)"),
                              (SINK, "sink mirror is already being delivered (another process)")):
                assert not errors and _sink_locked(config), errors
                started = time.monotonic()
                result = click(defs, instance, {key})
                took = time.monotonic() - started
                assert result.success, key
                assert not result.get_asset_materialization_events(), key  # recorded nothing
                assert says in _log(instance, result.run_id), _log(instance, result.run_id)
                assert instance.get_run_by_id(result.run_id).tags["dagster/max_retries"] == "0"
                assert took < 30, took
        finally:
            deliverer.stop()
            worker.join(60)


def _sink_locked(config: Any) -> bool:
    from cdc_pipeline.defs.materialize import _locked

    return _locked(config, ["cdc_pipeline.deliver:mirror"])


def test_materialize_without_a_stream_catches_up_and_materialize_all_backfills_nothing(
        source_db, db_factory, write_config, tmp_path, spark):
    config, dest = _prepare(source_db, db_factory, write_config)
    source_db.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 50) g")
    defs = _defs(tmp_path / "cdc.yaml")
    with DagsterInstance.ephemeral() as instance:
        everything = {LOG, SINK, SNAPSHOT}
        result = click(defs, instance, everything)
        assert result.success
        log = _log(instance, result.run_id)
        assert "catching up until idle" in log and "not backfilling: this run was launched for other assets" in log
        mats = {e.asset_key for e in result.get_asset_materialization_events()}
        assert SNAPSHOT not in mats and LOG in mats, mats
        with __import__("psycopg").connect(config.state_dsn) as conn:
            assert BackfillStore("cdc_pipeline").list(conn) == []  # no backfill nobody asked for
        # The sink alone: catches up (the rows reach the mirror) and ends.
        result = click(defs, instance, {SINK})
        assert result.success and len(rows(dest.dsn, "mirror.t")) == 50
        steps = [e for e in instance.all_logs(result.run_id) if e.dagster_event is not None
                 and e.dagster_event.event_type == DagsterEventType.STEP_SUCCESS]
        assert steps
        # The snapshot alone is asked for: it backfills.
        with drain_running(config):
            result = click(defs, instance, {SNAPSHOT})
        assert result.success and [e.asset_key for e in result.get_asset_materialization_events()] == [SNAPSHOT]
