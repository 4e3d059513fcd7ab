"""Dagster in process: the asset graph's lineage, the long-lived drain and delivery runs (paced
materializations with data versions, lag checks recorded on change), and the sensors (keep one drain alive; never skip due work)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import yaml
from dagster import AssetKey, DagsterEventType, DagsterInstance, RunRequest, build_sensor_context
from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
from dagster._core.loader import LoadingContextForTest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.capture.drain import Drain
from cdc_pipeline.core.positions import position_lsn_text
from cdc_pipeline.defs.capture import DRAIN_JOB
from cdc_pipeline.defs.health import PARKED_CHECK, SINK_LAG_CHECK, SLOT_LAG_CHECK
from cdc_pipeline.defs.streaming import EVENT_SECONDS
from cdc_pipeline.defs.tags import AFTER_TAG, SINK_TAG
from cdc_pipeline.defs.versions import STREAM_VERSION
from cdc_pipeline.delivery.spark_stage import spark_session
from cdc_pipeline.state.failed_messages import FailedMessages
from cdc_pipeline.state.sink_offsets import SinkOffsets
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, mirror_config, wait_until
from cdc_pipeline_tests.integration.delivery.test_backlog import wait_past_limit

LOG = AssetKey(["cdc", "change_log"])
SINK = AssetKey(["sink", "mirror"])


def _defs(path: Path):  # type: ignore[no-untyped-def]
    from cdc_pipeline.defs import build_definitions

    return build_definitions(str(path))


def test_lineage_source_tables_change_log_sinks(source_db, db_factory, write_config, tmp_path):
    dest = db_factory()
    data = mirror_config(source_db.dsn, dest.dsn, [{"name": "public.orders", "sort_column": "updated_at",
                                                    "partitions": {"kind": "daily", "start": "2026-01-01"}},
                                                   "public.customers"])
    data["sinks"].append({"name": "hook", "tables": ["public.orders"],
                          "destination": {"type": "webhook", "url": "http://127.0.0.1:9/x"}})
    write_config(data)
    defs = _defs(tmp_path / "cdc.yaml")
    graph = defs.resolve_asset_graph()
    orders, customers = AssetKey(["source", "public", "orders"]), AssetKey(["source", "public", "customers"])
    snapshot = AssetKey(["cdc", "snapshot", "public", "orders_snapshot"])
    assert graph.get(LOG).parent_keys == {orders, customers}
    assert graph.get(SINK).parent_keys == {LOG, snapshot, AssetKey(["cdc", "snapshot", "public", "customers_snapshot"])}
    assert graph.get(AssetKey(["sink", "hook"])).parent_keys == {LOG, snapshot}
    assert graph.get(snapshot).parent_keys == {orders}
    assert graph.get(snapshot).partitions_def is not None
    specs = {s.key: s for s in defs.resolve_all_asset_specs()}
    assert specs[orders].metadata["dagster/table_name"] == "public.orders"
    assert not graph.get(orders).is_materializable  # the source tables are not ours to materialize
    assert specs[SINK].metadata["destination_tables"] == "mirror.customers, mirror.orders"
    assert {c.name for c in graph.get(SINK).check_keys} == {SINK_LAG_CHECK, PARKED_CHECK}
    assert {c.name for c in graph.get(LOG).check_keys} == {SLOT_LAG_CHECK}
    # Typed resources: one for the config, one that builds any sink by name.
    assert {"cdc", "sinks", "pyspark"} <= set(defs.resources)
    assert type(defs.resources["sinks"].build("hook")).__name__ == "WebhookSink"
    assert {j.name for j in defs.resolve_all_job_defs()} >= {DRAIN_JOB, "deliver_mirror", "deliver_hook",
                                                            "backfill_public_orders"}
    # Streaming runs are restarted by their sensors, never also by Dagster's run retries.
    for job in (DRAIN_JOB, "deliver_mirror"):
        assert defs.resolve_job_def(job).tags["dagster/max_retries"] == "0"


REPORT_SECONDS = 5  # drain.report_seconds and delivery.report_seconds in these runs (default 60)


def _events(instance: DagsterInstance, run_id: str) -> tuple[list[Any], list[Any]]:
    """A run's materializations and check evaluations as stored in the instance's event log."""
    entries = [e for e in instance.all_logs(run_id) if e.dagster_event is not None]
    mats = [e for e in entries if e.dagster_event.event_type == DagsterEventType.ASSET_MATERIALIZATION]
    checks = [e for e in entries if e.dagster_event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION]
    return mats, checks


def _stale(instance: DagsterInstance, defs: Any, key: AssetKey) -> StaleStatus:
    resolver = CachingStaleStatusResolver(instance, defs.resolve_asset_graph(), LoadingContextForTest(instance))
    return resolver.get_status(key)


def _head(config: Any) -> str:
    with psycopg.connect(config.state_dsn) as conn:
        row = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.change_log "
                           "ORDER BY 1 DESC, 2 DESC LIMIT 1").fetchone()
    return position_lsn_text((row[0], row[1]))  # PostgreSQL's X/Y and the index, as the UI shows positions


def test_long_lived_drain_and_delivery_runs(source_db, db_factory, write_config, tmp_path):
    """Through a translator that renames and regroups every asset: the runs materialize and check the
    renamed assets (and the sink's run its own, renamed, upstream is the renamed change log). Under a
    steady load the runs record a materialization at most once per report_seconds and check evaluations
    only when they change; the sink's data version is its offset, and it reads synced while it keeps up
    and "Unsynced" once blocked longer than max_lag_seconds; a blocked sink turns lag_below_max red within
    max_lag_seconds + 30 s."""
    from cdc_pipeline.defs import build_definitions
    from cdc_pipeline_tests.e2e.test_dagster_dev import Load
    from cdc_pipeline_tests.unit.test_dagster_translator import RenamingTranslator, acme

    dest = db_factory()
    source_db.execute("CREATE TABLE orders (id int PRIMARY KEY, status text, amount numeric)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.orders"])
    data["drain"]["report_seconds"] = REPORT_SECONDS
    data["delivery"] = {"report_seconds": REPORT_SECONDS, "max_lag_seconds": 3}
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO orders SELECT g, 'new', g * 1.5 FROM generate_series(1, 500) g")
    source_db.execute("UPDATE orders SET status = 'paid' WHERE id % 3 = 0")
    source_db.execute("DELETE FROM orders WHERE id % 10 = 0")
    defs = build_definitions(str(tmp_path / "cdc.yaml"), RenamingTranslator())
    log, sink = acme("change_log", "change_log"), acme("sink", "mirror")
    assert defs.resolve_asset_graph().get(sink).parent_keys == {log, acme("snapshot", "public", "orders")}
    with DagsterInstance.ephemeral() as instance:
        # The drain streams for 16 s while 100 rows/s arrive.
        load = Load(source_db.dsn, rate=100, seconds=14, first_id=1001)
        run = defs.resolve_job_def(DRAIN_JOB).execute_in_process(
            instance=instance, run_config={"ops": {log.to_python_identifier(): {"config": {"max_seconds": 16}}}})
        load.join()
        assert run.success and load.error is None
        mats, checks = _events(instance, run.run_id)
        assert {m.dagster_event.asset_key for m in mats} == {log}
        # Data moved all along: one in-run materialization per report_seconds at most, plus the run's own.
        assert 2 <= len(mats) <= 16 / REPORT_SECONDS + 2, len(mats)
        gaps = [b.timestamp - a.timestamp for a, b in zip(mats[:-2], mats[1:-1], strict=True)]
        assert all(gap >= REPORT_SECONDS - 1 for gap in gaps), gaps  # stamped when stored: a little jitter
        final = mats[-1].asset_materialization
        assert final.metadata["drained_changes"].value == 716 + load.next_id - 1001
        assert final.metadata["log_head"].value == _head(config)
        assert final.tags["dagster/data_version"] == STREAM_VERSION.value  # a stream, not a point in it
        assert final.metadata["dagster/row_count"].value == 716 + load.next_id - 1001  # the log's rows
        # The slot check passed throughout: recorded once when first read, once at the end.
        assert [c.dagster_event.asset_check_evaluation_data.passed for c in checks] == [True, True]
        assert _stale(instance, defs, log) == StaleStatus.FRESH

        # A delivery run streams while the log grows (a CLI drain beside it, 100 rows/s); its sink is
        # blocked for a while (its table locked), then released.
        drainer = Drain(config)
        draining = threading.Thread(target=drainer.run, kwargs={"seconds": 120}, daemon=True)
        draining.start()
        blocked: dict[str, Any] = {}

        def block_the_sink() -> None:
            wait_until(lambda: dest.execute("SELECT to_regclass('mirror.orders')")[0][0] is not None, 120,
                       "the sink's first rows")
            with psycopg.connect(dest.dsn) as conn:
                conn.execute("LOCK TABLE mirror.orders IN ACCESS EXCLUSIVE MODE")
                blocked.update(at=time.time(), load=Load(source_db.dsn, rate=100, seconds=18, first_id=100_000))
                wait_until(lambda: _stale(instance, defs, sink) == StaleStatus.STALE, 3 + 3 * EVENT_SECONDS,
                           "the blocked sink to read Unsynced")  # behind by more than max_lag_seconds
                blocked["stale_after"] = time.time() - blocked["at"]
                threading.Event().wait(max(0.0, blocked["at"] + 3 + 2 * EVENT_SECONDS - time.time()))
            blocked["load"].join()

        blocker = threading.Thread(target=block_the_sink, daemon=True)
        blocker.start()
        run = defs.resolve_job_def("deliver_mirror").execute_in_process(
            instance=instance, run_config={"ops": {sink.to_python_identifier(): {"config": {"max_seconds": 30}}}})
        blocker.join()
        drainer.stop()
        draining.join(60)
        load = blocked["load"]
        assert run.success and load.error is None
        mats, checks = _events(instance, run.run_id)
        assert {m.dagster_event.asset_key for m in mats} == {sink}
        assert 2 <= len(mats) <= 30 / REPORT_SECONDS + 4, len(mats)  # + falling behind, catching up
        final = mats[-1].asset_materialization
        assert final.metadata["messages_delivered"].value > 716
        with psycopg.connect(config.state_dsn) as conn:
            offset = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.sink_offsets "
                                  "WHERE sink = 'mirror'").fetchone()
        assert final.tags["dagster/data_version"] == position_lsn_text(offset) == final.metadata["offset"].value
        # Checks are recorded when they change: lag_below_max passed, failed during the stall (within
        # max_lag_seconds + 30 s of its start), passed again; and the run's final evaluations.
        lag = [(c.timestamp, c.dagster_event.asset_check_evaluation_data.passed) for c in checks
               if c.dagster_event.asset_check_evaluation_data.check_name == SINK_LAG_CHECK]
        failed_at = next(t for t, passed in lag if not passed)
        assert blocked["at"] < failed_at <= blocked["at"] + 3 + 30, (blocked["at"], lag)
        assert [p for _, p in lag][-1] is True
        assert len(lag) <= 7, lag  # not one per read (every 5 s over 30 s), and growth only at steps
        parked = [c for c in checks if c.dagster_event.asset_check_evaluation_data.check_name == PARKED_CHECK]
        assert len(parked) == 2 and all(c.dagster_event.asset_check_evaluation_data.passed for c in parked)
        # Caught up again, the sink names the log's version as its input: synced.
        assert _stale(instance, defs, sink) == StaleStatus.FRESH
        assert final.metadata["dagster/row_count"].value == final.metadata["delivered_total"].value
    drain(config)  # whatever the run left: the mirror ends exact
    deliver(config, spark_session(config.spark))
    total = source_db.execute("SELECT count(*) FROM orders")[0][0]
    assert assert_mirrored(source_db.dsn, "public.orders", dest.dsn, "mirror.orders") == total


def _tick(defs, instance, name):  # type: ignore[no-untyped-def]
    sensor = defs.get_sensor_def(name)
    with build_sensor_context(instance=instance, resources={"cdc": defs.resources["cdc"]}, definitions=defs,
                              cursor=getattr(_tick, "cursor", None)) as ctx:
        data = sensor.evaluate_tick(ctx)  # resolves targets as the daemon does
    _tick.cursor = data.cursor  # type: ignore[attr-defined]
    return data


def test_sensors_keep_a_drain_alive_and_never_skip_due_retries(source_db, db_factory, write_config, tmp_path):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"]))
    setup(config)
    defs = _defs(tmp_path / "cdc.yaml")
    with DagsterInstance.ephemeral() as instance:
        data = _tick(defs, instance, "cdc_drain_sensor")
        [request] = data.run_requests
        assert request.job_name == DRAIN_JOB and request.run_key is None
        assert [e.check_name for e in data.asset_events] == [SLOT_LAG_CHECK]  # no drain yet: the sensor records it
        # A drain run is active: the sensor leaves it alone (cheap evaluation, no second drain).
        instance.create_run_for_job(defs.resolve_job_def(DRAIN_JOB), tags=request.tags)
        assert not _tick(defs, instance, "cdc_drain_sensor").run_requests

        # The idle-source retry case: nothing new in the log, one parked message coming due. Every tick
        # that finds it due (and no active run) requests a run; no run key, so Dagster never dedupes it.
        source_db.execute("INSERT INTO t VALUES (1)")
        drain(config)
        offsets, failed = SinkOffsets(config.state.schema_name), FailedMessages(config.state.schema_name)
        with psycopg.connect(config.state_dsn) as conn:
            (lsn, idx), = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.change_log").fetchall()
            offsets.sink_offset(conn, "mirror")
            failed.park(conn, "mirror", [((lsn, idx), None, "refused", 1)], [0])  # due now
            offsets.advance_offset(conn, "mirror", (lsn, idx), 0, 0, 1, None)
        for _ in range(3):
            data = _tick(defs, instance, "cdc_delivery_sensor")
            [request] = data.run_requests
            assert isinstance(request, RunRequest) and request.run_key is None
            assert request.job_name == "deliver_mirror" and request.tags[SINK_TAG] == "mirror"
        assert {e.check_name for e in data.asset_events} <= {SINK_LAG_CHECK, PARKED_CHECK}
        # While a delivery run is active for the sink, no second one.
        instance.create_run_for_job(defs.resolve_job_def("deliver_mirror"), tags=request.tags)
        assert not _tick(defs, instance, "cdc_delivery_sensor").run_requests


def test_loads_as_a_dagster_component(source_db, db_factory, write_config, tmp_path):
    from dagster.components.testing import create_defs_folder_sandbox

    from cdc_pipeline.defs.component import CdcPipelineComponent

    dest = db_factory()
    data = mirror_config(source_db.dsn, dest.dsn, ["public.orders"])
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(component_cls=CdcPipelineComponent, defs_yaml_contents={
            "type": "cdc_pipeline.defs.component.CdcPipelineComponent", "attributes": {"config": "cdc.yaml"}})
        (path / "cdc.yaml").write_text(yaml.safe_dump(data))
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            assert isinstance(component, CdcPipelineComponent)
            graph = defs.resolve_asset_graph()
            assert graph.get(SINK).parent_keys == {LOG, AssetKey(["cdc", "snapshot", "public", "orders_snapshot"])}
            assert graph.get(LOG).parent_keys == {AssetKey(["source", "public", "orders"])}
            assert defs.get_sensor_def("cdc_drain_sensor") is not None


def test_lag_checks_fail_when_the_pipeline_stalls(source_db, db_factory, write_config, tmp_path):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    data["delivery"] = {"max_lag_seconds": 1}
    config = write_config(data)
    setup(config)
    defs = _defs(tmp_path / "cdc.yaml")
    source_db.execute("INSERT INTO t VALUES (1)")
    drain(config)
    wait_past_limit(config, hours=1 / 3600)  # nothing delivers: the change is older than delivery.max_lag_seconds
    with DagsterInstance.ephemeral() as instance:
        _tick.cursor = None  # type: ignore[attr-defined]
        data = _tick(defs, instance, "cdc_delivery_sensor")
        [lag] = [e for e in data.asset_events if e.check_name == SINK_LAG_CHECK]
        assert lag.asset_key == SINK and not lag.passed and lag.metadata["lag_seconds"].value >= 1
        # The slot is gone: the change log's check fails and says so.
        source_db.execute("SELECT pg_drop_replication_slot('cdc_test')")
        [slot] = _tick(defs, instance, "cdc_drain_sensor").asset_events
        assert slot.check_name == SLOT_LAG_CHECK and not slot.passed and "does not exist" in slot.description


def _started(instance, defs, job, tags):  # type: ignore[no-untyped-def]
    from dagster import DagsterEvent, DagsterEventType

    run = instance.create_run_for_job(defs.resolve_job_def(job), tags=tags)
    instance.report_dagster_event(DagsterEvent(DagsterEventType.RUN_START.value, job_name=job), run.run_id)
    return run


def test_handover_to_a_warm_successor_near_the_end_of_a_run(source_db, db_factory, write_config, tmp_path):
    """Near a run's planned end the sensor starts its successor, which waits (warm) for the predecessor
    to finish and then takes over: the stream has no start-up gap, and runs stay one per run_minutes."""
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    data["drain"].update(run_minutes=60)
    data["delivery"] = {"run_minutes": 1}  # less than the handover lead: due for a successor at once
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO t SELECT generate_series(1, 100)")
    drain(config)
    defs = _defs(tmp_path / "cdc.yaml")
    with DagsterInstance.ephemeral() as instance:
        _tick.cursor = None  # type: ignore[attr-defined]
        drain_run = _started(instance, defs, DRAIN_JOB, {"dagster/sensor_name": "cdc_drain_sensor"})
        assert not _tick(defs, instance, "cdc_drain_sensor").run_requests  # 60 min left: no successor yet
        first = _started(instance, defs, "deliver_mirror", {SINK_TAG: "mirror", "dagster/sensor_name": "x"})
        [request] = _tick(defs, instance, "cdc_delivery_sensor").run_requests
        assert request.tags[AFTER_TAG] == first.run_id
        instance.create_run_for_job(defs.resolve_job_def("deliver_mirror"), tags=request.tags)
        assert not _tick(defs, instance, "cdc_delivery_sensor").run_requests  # one successor, not more

        # The successor waits for its predecessor, then delivers.
        finisher = threading.Timer(3.0, lambda: instance.report_run_canceled(first))
        finisher.start()
        started = time.monotonic()
        run = defs.resolve_job_def("deliver_mirror").execute_in_process(
            instance=instance, tags={**request.tags},
            run_config={"ops": {"sink__mirror": {"config": {"until_idle": True}}}})
        assert run.success and time.monotonic() - started >= 3.0
        logs = "\n".join(e.user_message for e in instance.all_logs(run.run_id))
        assert f"run {first.run_id} finished; taking over" in logs
        assert instance.get_run_by_id(drain_run.run_id).status.value == "STARTED"
    assert assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t") == 100
