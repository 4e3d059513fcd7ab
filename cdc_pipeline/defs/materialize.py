"""What a Materialize click does (a run of Dagster's `__ASSET_JOB`, or any job other than the asset's own),
so that it is safe on every asset:

- a streaming asset (`cdc/change_log`, `sink/<name>`) whose stream runs (its lock is held, or a run of its
  own job is active): the run ends at once, successfully, with a line saying where the stream runs, and
  records nothing; it never starts a second stream. When none runs, it does a bounded catch-up (until
  idle, at most CATCH_UP_SECONDS) instead of a half-hour stream: the sensors own the long-lived runs.
  Such a run is never retried (tagged `dagster/max_retries: 0` as it starts).
- a snapshot asset (a backfill) runs only when asked for: its own job, or a selection of snapshot assets
  alone (the asset page's Materialize, a partition backfill of it). A selection that also holds other
  assets (the lineage's "Materialize all", or a Dagster backfill over them) skips it, saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from dagster import AssetKey, DagsterRunStatus, RunsFilter
from psycopg import sql

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.core.lanes import lane_name
from cdc_pipeline.defs.runs import ACTIVE
from cdc_pipeline.defs.tags import DAGSTER_BACKFILL_TAG, MAX_RETRIES_TAG, NO_RUN_RETRIES
from cdc_pipeline.delivery.lane_keeper import deliver_lock
from cdc_pipeline.postgres import session

CATCH_UP_SECONDS = 60.0
DRAIN_LOCK = "cdc_pipeline.drain:{slot}"


def clicked(context: Any, own_jobs: Collection[str]) -> bool:
    """A run of another job than the asset's own (a Materialize click); tags it not to be retried."""
    if context.job_name in own_jobs:
        return False
    if context.run.tags.get(MAX_RETRIES_TAG) != "0":
        context.instance.add_run_tags(context.run_id, NO_RUN_RETRIES)
    return True


def run_bounds(context: Any, own_jobs: Collection[str], seconds: float, until_idle: bool,
               elsewhere: Callable[[], str | None], busy: str, idle: str, keeper: str) -> tuple[float, bool] | None:
    """(seconds, until_idle) of a streaming asset's run: as configured for a run of its own job; for a
    Materialize click, None when its stream runs `elsewhere()` (logging `busy` and where), else a bounded
    catch-up (logging `idle`, and `keeper`: who keeps the long-lived runs)."""
    if not clicked(context, own_jobs):
        return seconds, until_idle
    where = elsewhere()
    if where is not None:
        context.log.info(f"{busy} ({where}): nothing to do, this run ends")
        return None
    seconds = min(seconds, CATCH_UP_SECONDS)
    context.log.info(f"{idle}: catching up until idle (at most {seconds:.0f} s); {keeper}")
    return seconds, True


def _locked(pipeline: PipelineConfig, names: list[str]) -> bool:
    with session.connect(pipeline.state_dsn, autocommit=True) as conn:
        query = sql.SQL("SELECT {}").format(session.lock_holder_sql())
        return any(bool((conn.execute(query, (name,)).fetchone() or (False,))[0]) for name in names)


def _active_run(context: Any, jobs: Collection[str]) -> str | None:
    for job in jobs:
        for record in context.instance.get_run_records(RunsFilter(job_name=job, statuses=ACTIVE), limit=3):
            run = record.dagster_run
            if run.run_id != context.run_id and run.status != DagsterRunStatus.QUEUED:
                return f"run {run.run_id} of job {job}"
    return None


def drain_elsewhere(context: Any, pipeline: PipelineConfig, own_jobs: Collection[str]) -> str | None:
    """Where the drain streams, if it does (an active run of its job, or any process holding its lock)."""
    run = _active_run(context, own_jobs)
    if run is not None:
        return run
    return "another process" if _locked(pipeline, [DRAIN_LOCK.format(slot=pipeline.source.slot)]) else None


def delivery_elsewhere(context: Any, pipeline: PipelineConfig, sink: SinkConfig,
                       own_jobs: Collection[str]) -> str | None:
    run = _active_run(context, own_jobs)
    if run is not None:
        return run
    locks = [deliver_lock(lane_name(sink.name, lane, sink.lanes)) for lane in range(sink.lanes)]
    return "another process" if _locked(pipeline, locks) else None


def backfill_not_asked(context: Any, snapshot_keys: Collection[AssetKey], own_job: str) -> str | None:
    """Why this run should not backfill: its selection (or its Dagster backfill's) holds other assets."""
    if context.job_name == own_job:
        return None
    # The run's selection (a launched run), else its job's (a subset executed in process).
    selected = set(context.run.asset_selection or context.job_def.asset_layer.selected_asset_keys)
    backfill_id = context.run.tags.get(DAGSTER_BACKFILL_TAG)
    if backfill_id:
        backfill = context.instance.get_backfill(backfill_id)
        selected |= set(getattr(backfill, "asset_selection", None) or ())
    others = sorted(k.to_user_string() for k in selected - set(snapshot_keys))
    if not others:
        return None
    return (f"not backfilling: this run was launched for other assets too ({', '.join(others[:3])}"
            f"{', ...' if len(others) > 3 else ''}), not for snapshots alone. A backfill runs only when asked for: "
            "Materialize on the snapshot asset's own page, or its backfill_<schema>_<table> job")
