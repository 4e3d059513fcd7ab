"""Capture: the source tables (specs only), the change log asset, materialized by the long-lived
`cdc_drain` run, and the drain sensor that keeps one such run alive.

The sensor owns the drain's life without streaming in its own evaluation: each tick (every few
seconds, a couple of cheap queries) it sees whether a drain run is active, starts one when none is,
and restarts it after a failure with capped backoff. The run streams the slot into the change log
for `drain.run_minutes` (or until terminated); it reads the log's figures and the slot-lag check every
few seconds and records what changed (defs/pacing.py). Streaming in a run rather than in the sensor: no gap between ticks, no sensor
evaluation timeout, the drain's logs and failures on the Runs page, and a terminate button.
"""


from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    DefaultSensorStatus,
    Definitions,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset,
    asset_check,
    define_asset_job,
    in_process_executor,
    sensor,
)

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.config.errors import describe_error
from cdc_pipeline.defs.asset_data import ChangeLogData, SourceTableData
from cdc_pipeline.defs.backfill_pool import BACKFILL_POOL
from cdc_pipeline.defs.drain_run import DRAIN_JOB, DrainResource, DrainRunConfig
from cdc_pipeline.defs.health import (
    SLOT_LAG_CHECK,
    SLOT_LAG_DESCRIPTION,
    slot_check,
    slot_figures,
)
from cdc_pipeline.defs.resources import CdcConfigResource
from cdc_pipeline.defs.runs import next_run
from cdc_pipeline.defs.tags import AFTER_TAG, DRAIN_TAGS, NO_RUN_RETRIES
from cdc_pipeline.defs.translator import CdcTranslator, asset_args, source_tables


def build_change_log_asset(spec: AssetSpec, tables: list[str]) -> AssetsDefinition:
    sources = [dep.asset_key for dep in spec.deps]

    @asset(**asset_args(spec), output_required=False)
    def _change_log(context: AssetExecutionContext, config: DrainRunConfig, drain: DrainResource) -> Iterator[Any]:
        yield from drain.stream(context, config, tables, sources)

    return _change_log


def build_slot_check(key: AssetKey) -> AssetChecksDefinition:
    """`slot_lag_below_max` as a definition of its own: the drain run records it while it streams, the
    sensor when no drain runs, and the Checks tab's Execute reads it once."""

    @asset_check(asset=key, name=SLOT_LAG_CHECK, description=SLOT_LAG_DESCRIPTION)
    def _check(context: AssetCheckExecutionContext, cdc: CdcConfigResource) -> AssetCheckResult:
        pipeline = cdc.load()
        ev = slot_check(pipeline, key, slot_figures(pipeline))
        return AssetCheckResult(passed=ev.passed, severity=ev.severity, description=ev.description,
                                metadata=ev.metadata)

    return _check


def ensure_backfill_pool(instance: Any) -> None:
    """Gives the backfill pool its limit (dagster.yaml's pools default_limit) before any backfill is queued:
    Dagster 1.13's run queue creates a pool's limit on the first tick that sees a queued run of it, and
    dequeues that tick's runs without the limit (three partitions launched at once all started)."""
    storage = instance.event_log_storage
    if storage.supports_global_concurrency_limits and BACKFILL_POOL not in storage.get_concurrency_keys():
        storage.initialize_concurrency_limit_to_default(BACKFILL_POOL)


def build_drain_job(key: AssetKey) -> Any:
    # In process: the run worker is the drain (no step subprocess to start or to forward a terminate to).
    return define_asset_job(DRAIN_JOB, selection=AssetSelection.assets(key).without_checks(), tags={**DRAIN_TAGS, **NO_RUN_RETRIES},
                            executor_def=in_process_executor,
                            description="Streams the replication slot into the change log (long-lived)")


def build_drain_sensor(job: Any, key: AssetKey, interval: int = 5) -> SensorDefinition:
    @sensor(name="cdc_drain_sensor", minimum_interval_seconds=interval, default_status=DefaultSensorStatus.RUNNING,
            job=job, description="Keeps one cdc_drain run streaming: starts it when none is active, restarts "
                                 "it after a failure (capped backoff). Evaluations take milliseconds.")
    def _sensor(context: SensorEvaluationContext, cdc: CdcConfigResource) -> SensorResult | SkipReason:
        pipeline = cdc.load()
        ensure_backfill_pool(context.instance)
        request = next_run(context, DRAIN_JOB, DRAIN_TAGS, pipeline.drain.run_minutes * 60)
        if isinstance(request, str):
            return SkipReason(request)
        events: list[Any] = []
        if AFTER_TAG not in request.tags:
            try:  # no drain is running: record the slot's lag so a dead drain shows in asset health
                events.append(slot_check(pipeline, key, slot_figures(pipeline)))
            except Exception as exc:
                context.log.warning(f"could not read the slot's figures: {describe_error(exc)}")
        # No run key: every request is a fresh start or a successor; next_run checked the active runs.
        return SensorResult(run_requests=[request], asset_events=events)

    return _sensor


def capture_definitions(pipeline: PipelineConfig, translator: CdcTranslator) -> Definitions:
    """The source tables, the change log with its slot-lag check, the drain job and its sensor."""
    sources = [translator.get_asset_spec(SourceTableData(pipeline, t)) for t in source_tables(pipeline)]
    change_log = translator.get_asset_spec(ChangeLogData(pipeline))
    job = build_drain_job(change_log.key)
    return Definitions(assets=[*sources, build_change_log_asset(change_log, source_tables(pipeline))], jobs=[job],
                       asset_checks=[build_slot_check(change_log.key)],
                       sensors=[build_drain_sensor(job, change_log.key)])
