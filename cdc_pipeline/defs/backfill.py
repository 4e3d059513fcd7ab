"""Per configured table: a backfill asset, its job, an asset check, and (for time-partitioned tables) a
schedule that re-runs the previous partition.

A table with ``partitions`` gets a partitioned asset: each partition is a window of its
``sort_column`` (a day, hour, week or month; or an integer range), and materializing a partition
backfills exactly that window (``start`` inclusive, ``end`` exclusive; NULL sort values are in no
partition). Without partitions, materializing runs a full backfill ordered by the primary key.
The run config picks the sinks (default: every sink of the table). The backfill completes only when
the drain (the drain sensor) has reconciled its pages, so the run waits for it.

A retry (the RetryPolicy's, or a re-execution of a failed run) asks for the same table, sinks and
window, which is the same backfill while it is active: it resumes from the checkpoint.
"""


import math
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    Backoff,
    Config,
    DailyPartitionsDefinition,
    DefaultScheduleStatus,
    Definitions,
    Failure,
    HourlyPartitionsDefinition,
    Jitter,
    MaterializeResult,
    MetadataValue,
    MonthlyPartitionsDefinition,
    PartitionsDefinition,
    PreviewWarning,
    RetryPolicy,
    StaticPartitionsDefinition,
    TimeWindowPartitionsDefinition,
    WeeklyPartitionsDefinition,
    asset,
    asset_check,
    build_schedule_from_partitioned_job,
    define_asset_job,
)

from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest, Progress
from cdc_pipeline.config import ConfigError, PipelineConfig, TableConfig, redact
from cdc_pipeline.config.errors import without_secrets
from cdc_pipeline.core.backfill_origin import dagster_links, dagster_origin, started_by
from cdc_pipeline.defs.asset_data import SnapshotData
from cdc_pipeline.defs.backfill_pool import BACKFILL_POOL
from cdc_pipeline.defs.columns import column_schema
from cdc_pipeline.defs.materialize import backfill_not_asked
from cdc_pipeline.defs.resources import CdcConfigResource
from cdc_pipeline.defs.tags import BACKFILL_ID_TAG, BACKFILL_TAGS, DAGSTER_BACKFILL_TAG, ROW_COUNT
from cdc_pipeline.defs.translator import CdcTranslator, asset_args
from cdc_pipeline.postgres import session
from cdc_pipeline.state.backfills import BackfillInfo, BackfillStore

POOL = BACKFILL_POOL  # dagster.yaml: at most 2 runs with a backfill step, however launched
CHECK_NAME = "backfill_completed"
INTEGER_PARTITIONS = 100  # integer partitions without a step: this many ranges
# Transient failures (connection lost, server restart) fail the step; the retry resumes the backfill.
BACKFILL_RETRY = RetryPolicy(max_retries=3, delay=2, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS)

_TIME_PARTITIONS: dict[str, type[TimeWindowPartitionsDefinition]] = {
    "daily": DailyPartitionsDefinition, "hourly": HourlyPartitionsDefinition,
    "weekly": WeeklyPartitionsDefinition, "monthly": MonthlyPartitionsDefinition,
}


class BackfillRunConfig(Config):
    sinks: list[str] = []  # empty: every sink that receives the table
    max_query_ms: int | None = None  # empty: backfill.max_query_ms from cdc.yaml
    wait_if_busy: bool = True  # another live backfill of the table and a sink: wait instead of failing


def backfill_job_name(table: TableConfig) -> str:
    return f"backfill_{table.schema_name}_{table.table_name}"


def _utc(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value


def integer_ranges(table: TableConfig) -> list[tuple[int, int]]:
    p = table.partitions
    assert p is not None and p.kind == "integer"
    if p.end is None:
        raise ConfigError(f"tables[{table.qualified}].partitions.end: required for kind 'integer' "
                          "(integer partitions are a fixed list of ranges)")
    lo, hi = int(p.start), int(p.end)
    step = p.step or max(1, math.ceil((hi - lo) / INTEGER_PARTITIONS))
    return [(a, min(a + step, hi)) for a in range(lo, hi, step)]


def partitions_for(table: TableConfig) -> PartitionsDefinition | None:
    """Time windows (UTC) or integer ranges of the table's sort column, from its `partitions` config."""
    p = table.partitions
    if p is None:
        return None
    if p.kind == "integer":
        return StaticPartitionsDefinition([f"{a}..{b}" for a, b in integer_ranges(table)])
    end = _utc(p.end) if p.end else None
    return _TIME_PARTITIONS[p.kind](start_date=_utc(p.start), end_date=end, timezone="UTC")


def window_of(context: AssetExecutionContext | AssetCheckExecutionContext,
              table: TableConfig) -> tuple[str | None, str | None]:
    """The sort-column window [start, end) of the run's partition, as text PostgreSQL reads in the
    column's own type (a timestamp with an offset is read as UTC by timestamptz, and the offset is
    ignored by timestamp, whose partitions are UTC too)."""
    if not context.has_partition_key:
        return None, None
    assert table.partitions is not None
    if table.partitions.kind == "integer":
        lo, _, hi = context.partition_key.partition("..")
        return lo, hi
    window = context.partition_time_window
    return (window.start.astimezone(UTC).isoformat(sep=" "), window.end.astimezone(UTC).isoformat(sep=" "))


def run_origin(context: AssetExecutionContext) -> str:
    """The backfill's origin: this run (and the run it retries), its Dagster backfill and partition."""
    run = context.run
    return dagster_origin(run.run_id, run.root_run_id, run.tags.get(DAGSTER_BACKFILL_TAG),
                          context.partition_key if context.has_partition_key else None)


def build_backfill_asset(table: TableConfig, spec: AssetSpec, snapshot_keys: list[AssetKey]) -> AssetsDefinition:
    """The table's snapshot in the change log (its rows as read messages): what a backfill produces."""

    @asset(**asset_args(spec), partitions_def=partitions_for(table), retry_policy=BACKFILL_RETRY, pool=POOL,
           output_required=False)
    def _backfill(context: AssetExecutionContext, config: BackfillRunConfig,
                  cdc: CdcConfigResource) -> Iterator[MaterializeResult]:
        not_asked = backfill_not_asked(context, snapshot_keys, backfill_job_name(table))
        if not_asked:  # e.g. the lineage's "Materialize all" (defs/materialize.py)
            context.log.info(not_asked)
            return
        pipeline = cdc.load()
        start, end = window_of(context, table)
        request = BackfillRequest(
            table.qualified, tuple(config.sinks), table.sort_column if context.has_partition_key else None,
            start, end, config.max_query_ms, origin=run_origin(context))
        tagged: list[str] = []

        def report(progress: Progress) -> None:
            if not tagged:  # the run points at the pipeline's backfill from its first report on
                tagged.append(progress.backfill_id)
                context.instance.add_run_tags(context.run_id, {BACKFILL_ID_TAG: progress.backfill_id})
            context.log.info(progress.line())

        runner = Backfiller(pipeline, request, on_progress=report, progress_seconds=5.0,
                            wait_if_busy=config.wait_if_busy)
        context.log.info(f"{runner.spec.describe()} -> {', '.join(runner.spec.sinks)}")
        try:
            result = runner.run()
        except Exception as exc:
            error = without_secrets(exc)
            if error is exc:
                raise
            raise error from None
        if not tagged:
            context.instance.add_run_tags(context.run_id, {BACKFILL_ID_TAG: result.backfill_id})
        for warning in result.warnings:
            context.log.warning(redact(warning))
        if result.status != "completed":
            raise Failure(description=f"backfill {result.backfill_id} ended {result.status}",
                          metadata=_metadata(result), allow_retries=result.status == "interrupted")
        yield MaterializeResult(metadata={**_metadata(result), **column_schema(pipeline, table.qualified)})

    return _backfill


def _metadata(result: Progress) -> dict[str, object]:
    meta: dict[str, object] = {k: v for k, v in result.as_metadata().items() if v not in (None, "")}
    meta["cursor"] = MetadataValue.text(str(result.cursor))
    meta[ROW_COUNT] = result.rows_emitted  # the rows this backfill put in the change log (its snapshot)
    return meta


def build_backfill_check(table: TableConfig, key: AssetKey) -> AssetChecksDefinition:
    with warnings.catch_warnings():  # a partitioned check is "preview" in Dagster 1.13: chosen knowingly
        warnings.simplefilter("ignore", PreviewWarning)
        return _backfill_check(table, key)


def _backfill_check(table: TableConfig, key: AssetKey) -> AssetChecksDefinition:
    @asset_check(asset=key, name=CHECK_NAME, partitions_def=partitions_for(table),
                 description=f"The backfill of {table.qualified} (of the partition, for a partitioned table) "
                             "completed: in a run that backfills, that run's own backfill; executed by hand, the "
                             "latest backfill of the partition's window")
    def _check(context: AssetCheckExecutionContext, cdc: CdcConfigResource) -> AssetCheckResult:
        pipeline = cdc.load()
        start, end = window_of(context, table)
        found = own_backfill(pipeline, table, context.run.run_id, context.run.root_run_id, start, end)
        partition = {"partition": context.partition_key} if context.has_partition_key else {}
        if found is None:
            return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN,
                                    metadata={"status": "no backfill yet", **partition})
        links = {k: v for k, v in dagster_links(found.origin).items() if v}
        return AssetCheckResult(
            passed=found.status == "completed", severity=AssetCheckSeverity.WARN,
            metadata={"backfill_id": found.id, "status": found.status, **partition, **links, "pages": found.pages,
                      "rows_read": found.rows_read, "rows_dropped": found.rows_dropped,
                      "cursor": MetadataValue.text(str(found.cursor)), "sinks": ", ".join(found.sinks),
                      **({"error": MetadataValue.text(redact(found.error))} if found.error else {})})

    return _check


def own_backfill(pipeline: PipelineConfig, table: TableConfig, run_id: str, root_run_id: str | None,
                 start: str | None, end: str | None) -> BackfillInfo | None:
    """The backfill this run (or the run it retries) started; else the latest one of the same window."""
    store = BackfillStore(pipeline.state.schema_name)
    with session.connect(pipeline.state_dsn, autocommit=True) as conn:
        same = [i for i in store.list(conn, limit=500) if i.table == table.qualified and same_window(i, start, end)]
    return next((i for i in same if started_by(i.origin, run_id, root_run_id)), same[0] if same else None)


def same_window(info: BackfillInfo, start: str | None, end: str | None) -> bool:
    if start is None and end is None:
        return info.start is None and info.end is None
    return (info.start, info.end) == (start, end)


def build_backfill_job(table: TableConfig, key: AssetKey) -> Any:
    return define_asset_job(backfill_job_name(table), selection=[key], tags=BACKFILL_TAGS,
                            description=f"Backfill {table.qualified}")


def build_backfill_schedule(job: Any, table: TableConfig) -> Any:
    """Time-partitioned tables: each day (hour, ...) re-run the partition that just ended."""
    if table.partitions is None or table.partitions.kind == "integer":
        return None
    return build_schedule_from_partitioned_job(
        job, name=f"{backfill_job_name(table)}_previous_partition", default_status=DefaultScheduleStatus.STOPPED,
        tags=BACKFILL_TAGS,
        description=f"Re-runs the backfill of the last complete {table.partitions.kind} partition of "
                    f"{table.qualified}")


def backfill_definitions(pipeline: PipelineConfig, translator: CdcTranslator) -> Definitions:
    """Per configured table: its snapshot asset, check and job, and its schedule when time-partitioned."""
    assets, checks, jobs, schedules = [], [], [], []
    specs = [translator.get_asset_spec(SnapshotData(pipeline, table)) for table in pipeline.tables]
    for table, spec in zip(pipeline.tables, specs, strict=True):
        assets.append(build_backfill_asset(table, spec, [s.key for s in specs]))
        checks.append(build_backfill_check(table, spec.key))
        job = build_backfill_job(table, spec.key)
        jobs.append(job)
        schedule = build_backfill_schedule(job, table)
        if schedule is not None:
            schedules.append(schedule)
    return Definitions(assets=assets, asset_checks=checks, jobs=jobs, schedules=schedules)
