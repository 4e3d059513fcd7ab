"""The `cdc_replay` Dagster job: the run config picks the window; a too-old window fails the run."""

from __future__ import annotations

import time
import uuid

import psycopg
import redis
from dagster import DagsterInstance

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.defs import build_definitions
from cdc_pipeline.defs.replay import REPLAY_JOB
from cdc_pipeline.state import retention
from cdc_pipeline_tests.helpers import deliver, drain, mirror_config


def test_replay_job_replays_the_configured_window(source_db, db_factory, write_config, spark):
    dest = db_factory()
    key = f"replay-dg-{uuid.uuid4().hex[:8]}"
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    data["sinks"] = [{"name": "stream", "tables": ["public.t"],
                      "destination": {"type": "redis_stream", "stream_key": key}}]
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO t VALUES (1, 'a')")
    time.sleep(0.2)
    start = source_db.execute("SELECT clock_timestamp()")[0][0].isoformat()
    source_db.execute("INSERT INTO t VALUES (2, 'b'), (3, 'c')")
    drain(config)
    deliver(config, spark, sink="stream")
    r = redis.Redis()
    try:
        first = r.xrange(key)
        defs = build_definitions(str(config.path))
        assert REPLAY_JOB in {j.name for j in defs.resolve_all_job_defs()}  # the whole repository loads
        with DagsterInstance.ephemeral() as instance:
            run = defs.resolve_job_def(REPLAY_JOB).execute_in_process(
                instance=instance, run_config={"ops": {"replay_window": {"config": {"sink": "stream", "start": start}}}})
            assert run.success
            assert [f[b"data"] for _, f in r.xrange(key)[3:]] == [f[b"data"] for _, f in first[1:]]

            with psycopg.connect(config.state_dsn) as conn:
                retention.trim_log(conn, "cdc_pipeline", 0.00001, ["stream"])
                conn.commit()
            run = defs.resolve_job_def(REPLAY_JOB).execute_in_process(
                instance=instance, raise_on_error=False,
                run_config={"ops": {"replay_window": {"config": {"sink": "stream", "start": start}}}})
            assert not run.success
            failure = next(e for e in run.all_events if e.event_type_value == "STEP_FAILURE")
            assert "oldest replayable time" in str(failure.event_specific_data.error)
            assert len(r.xrange(key)) == 5
    finally:
        r.delete(key)
        r.close()
