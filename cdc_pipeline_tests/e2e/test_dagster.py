"""Dagster end to end: the drain sensor's tick and the delivery job through Dagster's own APIs, and the
sensors and jobs visible in a running `dagster dev` through its GraphQL API."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psycopg
from dagster import DagsterInstance, SensorResult, build_sensor_context

from cdc_pipeline.defs.capture import CHANGE_LOG_KEY
from cdc_pipeline.defs.delivery import SINK_TAG, delivery_asset_key
from cdc_pipeline.setup import setup
from cdc_pipeline_tests.helpers import assert_mirrored, mirror_config


def _defs(path: Path):  # type: ignore[no-untyped-def]
    from cdc_pipeline.defs import build_definitions

    return build_definitions(str(path))


def test_drain_sensor_tick_and_delivery_job(source_db, db_factory, write_config, tmp_path):
    dest = db_factory()
    source_db.execute("CREATE TABLE orders (id int PRIMARY KEY, status text, amount numeric)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.orders"])
    data["drain"]["tick_seconds"] = 3
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO orders SELECT g, 'new', g * 1.5 FROM generate_series(1, 500) g")
    source_db.execute("UPDATE orders SET status = 'paid' WHERE id % 3 = 0")
    source_db.execute("DELETE FROM orders WHERE id % 10 = 0")

    defs = _defs(tmp_path / "cdc.yaml")
    with DagsterInstance.ephemeral() as instance:
        sensor = defs.get_sensor_def("cdc_drain_sensor")
        with build_sensor_context(instance=instance, resources={"cdc": defs.resources["cdc"]},
                                  definitions=defs) as ctx:
            result = sensor(ctx)
        assert isinstance(result, SensorResult)
        [request] = result.run_requests
        assert request.job_name == "deliver_mirror" and request.tags[SINK_TAG] == "mirror"
        [event] = result.asset_events
        assert event.asset_key == CHANGE_LOG_KEY
        assert event.metadata["drained_changes"].value == 500 + 166 + 50

        job = defs.resolve_job_def("deliver_mirror")
        run = job.execute_in_process(instance=instance, tags=request.tags)
        assert run.success
        mats = [
            e.materialization for e in run.get_asset_materialization_events()]
        [mat] = [m for m in mats if m.asset_key == delivery_asset_key("mirror")]
        assert mat.metadata["messages_delivered"].value == 716
        assert mat.metadata["lag_messages"].value == 0
        checks = run.get_asset_check_evaluations()
        assert checks and all(c.passed for c in checks)
    assert assert_mirrored(source_db.dsn, "public.orders", dest.dsn, "mirror.orders") == 450

    # The delivery sensor (for a drain running outside Dagster) targets the same jobs.
    source_db.execute("INSERT INTO orders VALUES (1000, 'late', 1)")
    from cdc_pipeline_tests.helpers import drain

    drain(config)
    with DagsterInstance.ephemeral() as instance:
        delivery_sensor = defs.get_sensor_def("cdc_delivery_sensor")
        with build_sensor_context(instance=instance, resources={"cdc": defs.resources["cdc"]},
                                  definitions=defs) as ctx:
            data = delivery_sensor.evaluate_tick(ctx)  # resolves targets as the daemon does
        [request] = data.run_requests
        assert request.job_name == "deliver_mirror"


def test_delivery_asset_materializes_with_dry_run(source_db, db_factory, write_config, tmp_path):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"]))
    setup(config)
    source_db.execute("INSERT INTO t SELECT generate_series(1, 20)")
    from cdc_pipeline_tests.helpers import drain

    drain(config)
    defs = _defs(tmp_path / "cdc.yaml")
    asset = defs.resolve_assets_def(delivery_asset_key("mirror"))
    result = defs.resolve_job_def("deliver_mirror").execute_in_process(run_config={
        "ops": {asset.node_def.name: {"config": {"dry_run": True}}}})
    assert result.success
    # A dry run sends nothing and leaves the offset alone.
    with psycopg.connect(dest.dsn) as conn:
        assert conn.execute("SELECT to_regclass('mirror.t')").fetchone() == (None,)
    with psycopg.connect(config.state_dsn) as conn:
        row = conn.execute("SELECT commit_lsn FROM cdc_pipeline.sink_offsets WHERE sink = 'mirror'").fetchone()
        assert row is None or row[0] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _graphql(port: int, query: str) -> dict:  # type: ignore[type-arg]
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def test_dagster_dev_shows_sensors_and_jobs(source_db, db_factory, write_config, tmp_path, pg_admin_dsn):
    dest = db_factory()
    storage = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"]))
    setup(config)
    home = tmp_path / "dagster_home"
    home.mkdir()
    root = Path(__file__).resolve().parents[2]
    (home / "dagster.yaml").write_text((root / "dagster.yaml").read_text())
    conn = psycopg.conninfo.conninfo_to_dict(storage.dsn)
    port = _free_port()
    env = dict(os.environ, DAGSTER_HOME=str(home), CDC_CONFIG=str(tmp_path / "cdc.yaml"),
               DAGSTER_PG_URL=f"postgresql+psycopg2://{conn['user']}@/{conn['dbname']}?host={conn['host']}"
                              f"&port={conn['port']}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-w", str(root / "workspace.yaml"), "-p", str(port),
         "-h", "127.0.0.1"], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        names: dict[str, list[str]] = {}
        while time.monotonic() < deadline:
            try:
                data = _graphql(port, "{ repositoriesOrError { ... on RepositoryConnection { nodes { "
                                      "name sensors { name } jobs { name } } } } }")
                nodes = data["data"]["repositoriesOrError"]["nodes"]
                if nodes:
                    names = {"sensors": [s["name"] for n in nodes for s in n["sensors"]],
                             "jobs": [j["name"] for n in nodes for j in n["jobs"]]}
                    break
            except (OSError, KeyError, TypeError):
                pass
            time.sleep(2)
        assert "cdc_drain_sensor" in names.get("sensors", []), names
        assert "cdc_delivery_sensor" in names["sensors"]
        assert "deliver_mirror" in names["jobs"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
