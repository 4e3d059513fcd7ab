"""The life of the long-lived runs, as the sensors see it: which are active, backoff after failures,
and the handover to a successor near a run's end.

Handover: a run streams for `run_minutes`, then ends. So that the stream has no gap while the next run
starts (a run worker, and for delivery a SparkSession, take seconds to start), the sensor launches the
successor `HANDOVER_SECONDS` before the active run's planned end, tagged with its predecessor's id; the
successor warms up, waits until the predecessor has finished, and takes over at once. The drain's and
the sinks' advisory locks still guarantee that only one of them streams.
"""

from __future__ import annotations

import time
from typing import Any

from dagster import DagsterRunStatus, RunRequest, RunsFilter, SensorEvaluationContext

from cdc_pipeline.defs.tags import AFTER_TAG, HANDOVER_TAG, SENSOR_NAME_TAG

ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
          DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
MAX_RESTART_BACKOFF = 60.0
HANDOVER_SECONDS = 90.0  # start the successor this long before the active run's planned end
POLL_SECONDS = 0.2


def restart_backoff(context: SensorEvaluationContext, job_name: str) -> float:
    """Seconds still to wait before restarting a job whose last n runs failed: 2^n, capped."""
    records = context.instance.get_run_records(RunsFilter(job_name=job_name), limit=6)
    failures = 0
    for record in records:
        if record.dagster_run.status != DagsterRunStatus.FAILURE:
            break
        failures += 1
    if not failures or records[0].end_time is None:
        return 0.0
    return max(0.0, records[0].end_time + min(MAX_RESTART_BACKOFF, 2.0 ** failures) - time.time())


def next_run(context: SensorEvaluationContext, job_name: str, tags: dict[str, str], run_seconds: float
             ) -> RunRequest | str:
    """The run request the sensor should make for a job that must always stream, or why none is due:
    a first run (none active), or a successor (one active, near its planned end)."""
    active = context.instance.get_run_records(RunsFilter(job_name=job_name, statuses=ACTIVE), limit=2)
    if not active:
        wait = restart_backoff(context, job_name)
        if wait > 0:
            return f"the last {job_name} runs failed: restarting in {wait:.0f} s"
        return RunRequest(job_name=job_name, tags=tags)
    run = active[0].dagster_run
    if len(active) > 1 or run.status != DagsterRunStatus.STARTED or active[0].start_time is None:
        return f"{job_name} run {run.run_id} is active"
    left = active[0].start_time + run_seconds - time.time()
    if (left > HANDOVER_SECONDS and HANDOVER_TAG not in run.tags) or run.tags.get(SENSOR_NAME_TAG) is None:
        return f"{job_name} run {run.run_id} is streaming ({max(0.0, left):.0f} s left)"
    return RunRequest(job_name=job_name, tags={**tags, AFTER_TAG: run.run_id})


def wait_for_predecessor(context: Any, log: Any) -> None:
    """In a successor run: wait (warm) until the run it takes over from has finished."""
    before = context.run.tags.get(AFTER_TAG)
    if not before:
        return
    log.info(f"taking over from run {before}: waiting for it to finish")
    started = time.monotonic()
    while True:
        run = context.instance.get_run_by_id(before)
        if run is None or run.is_finished:
            break
        time.sleep(POLL_SECONDS)
    log.info(f"run {before} finished; taking over after {time.monotonic() - started:.1f} s")
