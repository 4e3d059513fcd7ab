"""Lanes as Dagster runs (core/lanes.py): a sink with `lanes: 2` has one delivery job per lane, the sensor asks
for one run per lane with work, and two lane runs delivering at once, under a concurrent writer, leave the
mirror equal to the source."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import psycopg
from dagster import DagsterInstance, build_sensor_context

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.defs.tags import SINK_TAG
from cdc_pipeline_tests.helpers import assert_mirrored, drain, mirror_config

# A run worker: one lane's delivery job executed as a Dagster run.
RUN_LANE = """
import sys
from dagster import DagsterInstance
from cdc_pipeline.defs import build_definitions
path, lane, limit = sys.argv[1], int(sys.argv[2]), sys.argv[3]
job = build_definitions(path).resolve_job_def(f"deliver_mirror_lane{lane}")
config = {"until_idle": True} if limit == "idle" else {"max_seconds": float(limit)}
with DagsterInstance.ephemeral() as instance:
    result = job.execute_in_process(instance=instance, run_config={"ops": {"sink__mirror": {"config": {
        "lane": lane, **config}}}})
sys.exit(0 if result.success else 1)
"""


def test_two_lanes_as_two_dagster_runs(source_db, db_factory, write_config, tmp_path: Path) -> None:
    from cdc_pipeline.defs import build_definitions

    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"], lanes=2))
    setup(config)
    source_db.execute("INSERT INTO t SELECT g, 0 FROM generate_series(1, 500) g")
    drain(config)
    defs = build_definitions(str(tmp_path / "cdc.yaml"))
    assert defs.resolve_job_def("deliver_mirror_lane1").run_config_schema  # one job per lane
    with DagsterInstance.ephemeral() as instance:
        sensor = defs.get_sensor_def("cdc_delivery_sensor")
        with build_sensor_context(instance=instance, resources={"cdc": defs.resources["cdc"]},
                                  definitions=defs) as ctx:
            result = sensor.evaluate_tick(ctx)
        assert sorted((r.job_name, r.tags[SINK_TAG]) for r in result.run_requests) == [
            ("deliver_mirror_lane0", "mirror#0/2"), ("deliver_mirror_lane1", "mirror#1/2")]

    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(source_db.dsn, autocommit=True) as conn:
            n = 0
            while not stop.wait(0.01):
                n += 1
                conn.execute("UPDATE t SET v = v + 1 WHERE id = %s", (n % 500 + 1,))

    writer = threading.Thread(target=write)
    writer.start()
    try:  # each lane's job as its own run, in its own run worker (process), at once
        runs = [subprocess.Popen([sys.executable, "-c", RUN_LANE, str(tmp_path / "cdc.yaml"), str(lane), "10"])
                for lane in (0, 1)]
        assert [run.wait(300) for run in runs] == [0, 0]
    finally:
        stop.set()
        writer.join()
    drain(config)
    for lane in (0, 1):  # what the writer did after the runs' last look
        subprocess.run([sys.executable, "-c", RUN_LANE, str(tmp_path / "cdc.yaml"), str(lane), "idle"], check=True)
    assert assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t") == 500
    with psycopg.connect(config.state_dsn) as conn:
        lanes = conn.execute("SELECT lane, delivered FROM cdc_pipeline.sink_offsets WHERE sink = 'mirror' "
                             "ORDER BY lane").fetchall()
    assert [lane for lane, _ in lanes] == [0, 1] and all(delivered > 0 for _, delivered in lanes)
