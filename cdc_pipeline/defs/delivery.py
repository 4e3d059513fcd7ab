"""Per sink: its asset (what the sink holds), materialized by a long-lived delivery run; the delivery
job (one per lane of a sink with `lanes: N`, core/lanes.py); and the delivery sensor that keeps one run per
lagging sink (or lane) alive.

A delivery run keeps its SparkSession warm and polls the change log as `cdc-pipeline deliver` does,
for `delivery.run_minutes` (then the sensor starts the next one if the sink lags); it reads the sink's
lag and throughput and its lag checks every few seconds and records what changed (defs/pacing.py).
"""


import json
import time
from collections.abc import Iterator
from typing import Any

from dagster import (
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
    asset,
    define_asset_job,
    in_process_executor,
    sensor,
)

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.config.errors import describe_error
from cdc_pipeline.core.lanes import lane_name
from cdc_pipeline.defs.asset_data import ChangeLogData, SinkData
from cdc_pipeline.defs.delivery_run import DeliveryResource, DeliveryRunConfig
from cdc_pipeline.defs.health import (
    sink_checks,
    sink_figures,
)
from cdc_pipeline.defs.resources import CdcConfigResource
from cdc_pipeline.defs.runs import next_run
from cdc_pipeline.defs.sink_checks import build_sink_checks
from cdc_pipeline.defs.tags import AFTER_TAG, NO_RUN_RETRIES, delivery_run_tags
from cdc_pipeline.defs.translator import CdcTranslator, asset_args
from cdc_pipeline.postgres import session
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline.state.failed_messages import FailedMessages
from cdc_pipeline.state.lanes import SinkLanes
from cdc_pipeline.state.sink_offsets import SinkOffsets

SENSOR_CHECK_SECONDS = 30.0  # the sensor records a lagging sink's checks when no run is alive to
# No RetryPolicy (see streaming.py): the engine rides through sink outages and parks per-message
# failures; a run that fails anyway is restarted by the sensor with backoff.


def delivery_job_name(sink_name: str, lane: int = 0, lanes: int = 1) -> str:
    return f"deliver_{sink_name.replace('-', '_')}" + (f"_lane{lane}" if lanes > 1 else "")


def build_sink_asset(sink: SinkConfig, spec: AssetSpec, log_key: AssetKey) -> AssetsDefinition:
    upstream = (log_key, [dep.asset_key for dep in spec.deps if dep.asset_key != log_key])  # the log, the snapshots
    own_jobs = [delivery_job_name(sink.name, lane, sink.lanes) for lane in range(sink.lanes)]

    @asset(**asset_args(spec), output_required=False)
    def _deliver(context: AssetExecutionContext, config: DeliveryRunConfig, delivery: DeliveryResource
                 ) -> Iterator[Any]:
        yield from delivery.stream(context, config, sink.name, upstream, own_jobs)

    return _deliver


def build_delivery_jobs(sink: SinkConfig, asset_def: AssetsDefinition) -> list[Any]:
    """The sink's delivery job, or one per lane: the same asset, each with its lane in the run config."""
    return [define_asset_job(
        delivery_job_name(sink.name, lane, sink.lanes), selection=AssetSelection.assets(asset_def.key).without_checks(),
        config={"ops": {asset_def.op.name: {"config": {"lane": lane}}}} if sink.lanes > 1 else None,
        tags={**delivery_run_tags(lane_name(sink.name, lane, sink.lanes)), **NO_RUN_RETRIES},
        executor_def=in_process_executor,
        description=f"Delivers the change log to sink {sink.name}" + (f", lane {lane} of {sink.lanes}"
                                                                      if sink.lanes > 1 else "") + " (long-lived)")
        for lane in range(sink.lanes)]


def due_lanes(pipeline: PipelineConfig) -> list[tuple[str, int]]:
    """Sinks' lanes with work: messages after their offset, or parked messages whose retry is due; every lane
    of a sink whose split is to change (its new lanes make the change)."""
    schema = pipeline.state.schema_name
    offsets, change_log, failed, splits = SinkOffsets(schema), ChangeLog(schema), FailedMessages(schema), SinkLanes(schema)
    out = []
    with session.connect(pipeline.state_dsn, autocommit=True) as conn:
        for sink in pipeline.sinks:
            if splits.split(conn, sink.name)[0].lanes != sink.lanes:
                out += [(sink.name, lane) for lane in range(sink.lanes)]
                continue
            for lane in range(sink.lanes):
                offset = offsets.sink_offset(conn, sink.name, lane)
                if change_log.backlog(conn, sink.tables, offset, sink.name, 1) or failed.due_retries(conn, sink.name, 1,
                                                                                                     lane):
                    out.append((sink.name, lane))
    return out


def build_delivery_sensor(jobs: list[Any], keys: dict[str, AssetKey], interval: int = 5) -> SensorDefinition:
    @sensor(name="cdc_delivery_sensor", minimum_interval_seconds=interval, jobs=jobs,
            default_status=DefaultSensorStatus.RUNNING,
            description="Starts a long-lived delivery run for each sink with work (messages after its offset, "
                        "or parked messages due for retry) unless one is already active for it.")
    def _sensor(context: SensorEvaluationContext, cdc: CdcConfigResource) -> SensorResult:
        pipeline = cdc.load()
        # The cursor: when each sink's checks were last recorded by this sensor (JSON {sink: epoch s}).
        checked: dict[str, float] = json.loads(context.cursor) if context.cursor else {}
        requests, events = [], []
        for name, lane in due_lanes(pipeline):
            # A first run when none is active (after a backoff if the last ones failed), or the successor
            # of a run near its end. No run key: Dagster skips a run key it has seen, and an idle source
            # with parked messages coming due would repeat one; next_run checked the active runs.
            lanes = pipeline.sink(name).lanes
            request = next_run(context, delivery_job_name(name, lane, lanes),
                               delivery_run_tags(lane_name(name, lane, lanes)), pipeline.delivery.run_minutes * 60)
            if isinstance(request, str):
                continue
            requests.append(request)
            if AFTER_TAG not in request.tags and time.time() - checked.get(name, 0.0) >= SENSOR_CHECK_SECONDS:
                try:  # no run is alive to record the lag: a sink whose runs cannot start shows it
                    events += sink_checks(pipeline, keys[name], sink_figures(pipeline, pipeline.sink(name)), name)
                    checked[name] = time.time()
                except Exception as exc:
                    context.log.warning(f"could not read sink {name}'s figures: {describe_error(exc)}")
        return SensorResult(run_requests=requests, asset_events=events, cursor=json.dumps(checked, sort_keys=True),
                            skip_reason=None if requests else "every sink is caught up or already running")

    return _sensor


def delivery_definitions(pipeline: PipelineConfig, translator: CdcTranslator) -> Definitions:
    """Per sink its asset (with its lag checks) and delivery job; the delivery sensor over them all."""
    specs = {s.name: translator.get_asset_spec(SinkData(pipeline, s)) for s in pipeline.sinks}
    log_key = translator.get_asset_spec(ChangeLogData(pipeline)).key
    assets = {s.name: build_sink_asset(s, specs[s.name], log_key) for s in pipeline.sinks}
    jobs = [job for s in pipeline.sinks for job in build_delivery_jobs(s, assets[s.name])]
    checks = [c for s in pipeline.sinks for c in build_sink_checks(s, specs[s.name].key)]
    return Definitions(assets=list(assets.values()), asset_checks=checks, jobs=jobs,
                       sensors=[build_delivery_sensor(jobs, {name: spec.key for name, spec in specs.items()})])
