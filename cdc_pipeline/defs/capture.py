"""Capture: the source tables (specs only), the change log asset, materialized by the long-lived
`cdc_drain` run, and the drain sensor that keeps one such run alive.

The sensor owns the drain's life without streaming in its own evaluation: each tick (every few
seconds, a couple of cheap queries) it sees whether a drain run is active, starts one when none is,
and restarts it after a failure with capped backoff. The run streams the slot into the change log
for `drain.run_minutes` (or until terminated); it reads the log's figures and the slot-lag check every
few seconds and records what changed (defs/pacing.py). Streaming in a run rather than in the sensor: no gap between ticks, no sensor
evaluation timeout, the drain's logs and failures on the Runs page, and a terminate button.
"""


import time
from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    AssetSelection,
    AssetSpec,
    Config,
    DataVersion,
    DefaultSensorStatus,
    Definitions,
    MaterializeResult,
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

from cdc_pipeline.capture.drain import Drain, DrainStats
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.config.errors import describe_error
from cdc_pipeline.core.positions import Position, position_lsn_text
from cdc_pipeline.defs.asset_data import ChangeLogData, SourceTableData
from cdc_pipeline.defs.backfill_pool import BACKFILL_POOL
from cdc_pipeline.defs.handover import Handover
from cdc_pipeline.defs.health import (
    SLOT_LAG_CHECK,
    SLOT_LAG_DESCRIPTION,
    log_head,
    log_rows,
    slot_check,
    slot_figures,
)
from cdc_pipeline.defs.materialize import CATCH_UP_SECONDS, clicked, drain_elsewhere
from cdc_pipeline.defs.pacing import CheckGate, LogPace
from cdc_pipeline.defs.resources import CdcConfigResource
from cdc_pipeline.defs.run_metrics import run_metrics
from cdc_pipeline.defs.runs import next_run, wait_for_predecessor
from cdc_pipeline.defs.streaming import EVENT_SECONDS, stream_while
from cdc_pipeline.defs.tags import AFTER_TAG, DRAIN_TAGS, NO_RUN_RETRIES, ROW_COUNT
from cdc_pipeline.defs.translator import CdcTranslator, asset_args, source_tables
from cdc_pipeline.defs.versions import STREAM_VERSION, provenance_tags, upstream_inputs
from cdc_pipeline.ops.readiness import drain_streaming
from cdc_pipeline.ops.run_ports import run_port

DRAIN_JOB = "cdc_drain"


class DrainRunConfig(Config):
    max_seconds: float | None = None  # empty: drain.run_minutes from cdc.yaml
    until_idle: bool = False  # stop once the slot has nothing more (a one-off catch-up)


def drain_figures(pipeline: PipelineConfig, stats: DrainStats | None = None) -> dict[str, Any]:
    out = slot_figures(pipeline)
    if stats is not None:
        out.update(drained_changes=stats.changes, drained_transactions=stats.transactions,
                   drain_rate_changes_per_s=round(stats.rate, 1), heartbeats=stats.heartbeats,
                   # The drain rides through lost connections: how often it had to in this run, and why.
                   drain_retries=stats.retries)
        if stats.last_error:  # no "None" in the UI
            out["drain_last_error"] = str(stats.last_error)
    return out


def build_change_log_asset(spec: AssetSpec, tables: list[str]) -> AssetsDefinition:
    key = spec.key
    sources = [dep.asset_key for dep in spec.deps]

    @asset(**asset_args(spec), output_required=False)
    def _change_log(context: AssetExecutionContext, config: DrainRunConfig, cdc: CdcConfigResource) -> Iterator[Any]:
        pipeline = cdc.load()
        seconds = config.max_seconds or pipeline.drain.run_minutes * 60
        until_idle = config.until_idle
        if clicked(context, [DRAIN_JOB]):  # a Materialize click: never a second stream (defs/materialize.py)
            elsewhere = drain_elsewhere(context, pipeline, [DRAIN_JOB])
            if elsewhere is not None:
                context.log.info(f"the drain already streams ({elsewhere}): nothing to do, this run ends")
                return
            seconds, until_idle = min(seconds, CATCH_UP_SECONDS), True
            context.log.info(f"no drain streams: catching up until idle (at most {seconds:.0f} s); the "
                             "cdc_drain_sensor keeps the long-lived drain run")
        wait_for_predecessor(context, context.log)
        drain = Drain(pipeline)
        pace = LogPace(pipeline.drain.report_seconds, time.monotonic())
        gate = CheckGate()
        handover = Handover(context, [AssetCheckKey(key, SLOT_LAG_CHECK)], gate.last.keys, drain.stop)
        context.log.info(f"draining slot {pipeline.source.slot!r} for {seconds:.0f} s")

        def materialization(figures: dict[str, Any], head: Position) -> tuple[DataVersion, dict[str, Any],
                                                                               dict[str, str]]:
            # The stream's version, not the head's (defs/versions.py): the sinks that keep up stay synced.
            tags = provenance_tags(STREAM_VERSION, context.run_id, upstream_inputs(context.instance, sources))
            head_text = position_lsn_text(head)
            return STREAM_VERSION, {**figures, "log_head": head_text, "log_head_lsn": head_text,
                                    ROW_COUNT: log_rows(pipeline)}, tags

        def poll() -> list[Any]:
            figures = drain_figures(pipeline)
            head = log_head(pipeline, tables)
            events: list[Any] = []
            if pace.due(head, time.monotonic()):  # the log moved, and the last one is report_seconds old
                pace.recorded(head, time.monotonic())
                _, metadata, tags = materialization(figures, head)
                events.append(AssetMaterialization(key, metadata=metadata, tags=tags))
            events += gate.changed([slot_check(pipeline, key, figures)])
            handover.poll()  # a check executed by hand took the check's latest record (defs/handover.py)
            return events

        # The same /metrics, /healthz, /readyz as `drain --metrics-port`, on the drain's port of the map.
        with run_metrics(context.log, pipeline, run_port(pipeline), lambda: [drain], [drain_streaming(drain)]):
            stats = yield from stream_while(
                "cdc-drain", lambda: drain.run(seconds=seconds, until_idle=until_idle), drain.stop, poll,
                EVENT_SECONDS, lambda exc: context.log.warning(f"could not read the slot's figures: {exc}"),
                lambda result: context.log.info(_stopped(result)))
        context.log.info(f"drained {stats.changes} changes ({stats.rate:.0f}/s) in {stats.seconds:.0f} s")
        figures = drain_figures(pipeline, stats)
        version, metadata, tags = materialization(figures, log_head(pipeline, tables))
        yield slot_check(pipeline, key, figures)
        yield MaterializeResult(metadata=metadata, data_version=version, tags=tags)

    return _change_log


def _stopped(result: Any) -> str:
    if isinstance(result, DrainStats):
        lsn = result.committed_lsn
        return (f"drain stopped on request: log committed and slot acknowledged up to "
                f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X} ({result.changes} changes drained by this run)")
    return f"drain stopped on request ({result})"


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
