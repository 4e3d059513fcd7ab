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
    AssetCheckKey,
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
    asset,
    define_asset_job,
    in_process_executor,
    sensor,
)

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.config.errors import describe_error
from cdc_pipeline.core.lanes import lane_name
from cdc_pipeline.core.positions import START, position_lsn_text
from cdc_pipeline.defs.asset_data import ChangeLogData, SinkData
from cdc_pipeline.defs.columns import column_schema, sink_table
from cdc_pipeline.defs.handover import Handover
from cdc_pipeline.defs.health import (
    PARKED_CHECK,
    SINK_LAG_CHECK,
    failed_job_name,
    keeps_up,
    sink_checks,
    sink_figures,
)
from cdc_pipeline.defs.materialize import CATCH_UP_SECONDS, clicked, delivery_elsewhere
from cdc_pipeline.defs.pacing import CheckGate, ParkedWarning, SinkPace
from cdc_pipeline.defs.resources import CdcConfigResource, SinksResource, SparkResource
from cdc_pipeline.defs.run_metrics import run_metrics
from cdc_pipeline.defs.runs import next_run, wait_for_predecessor
from cdc_pipeline.defs.sink_checks import build_sink_checks
from cdc_pipeline.defs.streaming import EVENT_SECONDS, stream_while
from cdc_pipeline.defs.tags import AFTER_TAG, NO_RUN_RETRIES, ROW_COUNT, delivery_run_tags
from cdc_pipeline.defs.translator import CdcTranslator, asset_args
from cdc_pipeline.defs.versions import (
    DEFAULT_VERSION,
    Recorded,
    latest,
    provenance_tags,
    upstream_inputs,
    version_position,
)
from cdc_pipeline.delivery.dry_run import DryRun
from cdc_pipeline.delivery.engine import Deliverer, DeliveryStats
from cdc_pipeline.ops.readiness import deliverers_not_waiting
from cdc_pipeline.ops.run_ports import run_port
from cdc_pipeline.postgres import session
from cdc_pipeline.state.lanes import SinkLanes
from cdc_pipeline.state.store import Store

SENSOR_CHECK_SECONDS = 30.0  # the sensor records a lagging sink's checks when no run is alive to
# No RetryPolicy (see streaming.py): the engine rides through sink outages and parks per-message
# failures; a run that fails anyway is restarted by the sensor with backoff.


class DeliveryRunConfig(Config):
    lane: int = 0  # the lane this run delivers (its job sets it: deliver_<sink>_lane<I>)
    dry_run: bool = False
    max_seconds: float | None = None  # empty: delivery.run_minutes from cdc.yaml
    until_idle: bool = False  # stop once the sink has caught up (a one-off catch-up)


def delivery_job_name(sink_name: str, lane: int = 0, lanes: int = 1) -> str:
    return f"deliver_{sink_name.replace('-', '_')}" + (f"_lane{lane}" if lanes > 1 else "")


def build_sink_asset(sink: SinkConfig, spec: AssetSpec, log_key: AssetKey) -> AssetsDefinition:
    key = spec.key
    others = [dep.asset_key for dep in spec.deps if dep.asset_key != log_key]  # the snapshots

    own_jobs = [delivery_job_name(sink.name, lane, sink.lanes) for lane in range(sink.lanes)]

    @asset(**asset_args(spec), output_required=False)
    def _deliver(context: AssetExecutionContext, config: DeliveryRunConfig, cdc: CdcConfigResource,
                 pyspark: SparkResource, sinks: SinksResource) -> Iterator[Any]:
        pipeline = cdc.load()
        sink_config = pipeline.sink(sink.name)
        seconds = config.max_seconds or pipeline.delivery.run_minutes * 60
        until_idle = config.until_idle
        if clicked(context, own_jobs):  # a Materialize click: never a second stream (defs/materialize.py)
            elsewhere = delivery_elsewhere(context, pipeline, sink_config, own_jobs)
            if elsewhere is not None:
                context.log.info(f"sink {sink.name} is already being delivered ({elsewhere}): nothing to do, "
                                 "this run ends")
                return
            seconds, until_idle = min(seconds, CATCH_UP_SECONDS), True
            context.log.info(f"no delivery of {sink.name} runs: catching up until idle (at most {seconds:.0f} s); "
                             "the cdc_delivery_sensor keeps the long-lived delivery runs")
        wait_for_predecessor(context, context.log)  # a successor: Spark is warm, take over without a gap
        spark = pyspark.spark_session
        deliverer = (DryRun(pipeline, sink_config, spark, lane=config.lane) if config.dry_run else
                     Deliverer(pipeline, sink_config, spark, sink=sinks.build(sink.name), lane=config.lane))
        # What the sink's latest materialization named (a run before this one's): the UI changes only when needed.
        pace = SinkPace(pipeline.delivery.report_seconds, time.monotonic(),
                        named=latest(context.instance, key, log_key).version)
        gate = CheckGate()
        handover = Handover(context, [AssetCheckKey(key, name) for name in (SINK_LAG_CHECK, PARKED_CHECK)],
                            gate.last.keys, deliverer.stop)
        parked_warning = ParkedWarning()
        rate = {"delivered": None, "at": time.monotonic()}
        one_table = sink_table(sink_config)

        def columns() -> dict[str, Any]:  # dagster/column_schema: a sink holding one table's columns as they are
            return column_schema(pipeline, one_table) if one_table else {}

        def materialization(figures: dict[str, Any], log: Recorded, log_input: str
                            ) -> tuple[DataVersion, dict[str, str]]:
            version = DataVersion(figures["offset"])
            inputs = {log_key: (log_input, log.storage_id if log_input == log.version else None),
                      **upstream_inputs(context.instance, others)}
            return version, provenance_tags(version, context.run_id, inputs)

        def metadata(figures: dict[str, Any]) -> dict[str, Any]:  # dagster/row_count: the messages it applied
            return {**shown(figures), ROW_COUNT: figures["delivered_total"], **columns()}

        def poll() -> list[Any]:
            log = latest(context.instance, log_key)
            figures = sink_figures(pipeline, sink_config)
            now = time.monotonic()
            if rate["delivered"] is not None:
                figures["throughput_msgs_per_s"] = round(
                    (figures["delivered_total"] - rate["delivered"]) / max(1e-3, now - rate["at"]), 1)
            rate.update(delivered=figures["delivered_total"], at=now)
            offset = version_position(figures["offset"]) or START
            log_input = pace.input_version(now, offset, log.version or DEFAULT_VERSION, keeps_up(pipeline, figures))
            events: list[Any] = []
            if log_input is not None:
                pace.recorded(offset, log_input, now)
                _, tags = materialization(figures, log, log_input)
                events.append(AssetMaterialization(key, metadata=metadata(figures), tags=tags))
            if parked_warning.due(int(figures.get("parked") or 0), now):
                context.log.warning(parked_line(sink.name, figures))
            events += gate.changed(sink_checks(pipeline, key, figures, sink.name))
            handover.poll()  # a check executed by hand took the check's latest record (defs/handover.py)
            return events

        # The same /metrics, /healthz, /readyz as `deliver --sink S --lane I --metrics-port`, on the lane's
        # port of the map (none for a dry run, as in the CLI).
        port = None if config.dry_run else run_port(pipeline, sink.name, config.lane)
        with run_metrics(context.log, pipeline, port, lambda: [deliverer],
                         [deliverers_not_waiting(lambda: [deliverer])]):
            stats = yield from stream_while(
                f"cdc-deliver-{deliverer.lane.name}",
                lambda: deliverer.run(until_idle=until_idle, seconds=seconds),
                deliverer.stop, poll, EVENT_SECONDS,
                lambda exc: context.log.warning(f"could not read sink {sink.name}'s figures: {exc}"),
                lambda result: context.log.info(_stopped(sink.name, result)))
        log = latest(context.instance, log_key)
        figures = sink_figures(pipeline, sink_config)
        log_input = (log.version or DEFAULT_VERSION) if keeps_up(pipeline, figures) else figures["offset"]
        version, tags = materialization(figures, log, log_input)
        yield from sink_checks(pipeline, key, figures, sink.name)
        yield MaterializeResult(
            metadata=metadata({**stats.as_metadata(), **figures, "dry_run": config.dry_run}),
            data_version=version,
            tags=tags)

    return _deliver


def shown(figures: dict[str, Any]) -> dict[str, Any]:
    """Metadata as the UI shows it: no empty values (Dagster would print `null`)."""
    return {k: v for k, v in figures.items() if v is not None and v != ""}


def parked_line(sink: str, figures: dict[str, Any]) -> str:
    return (f"sink {sink}: {figures.get('parked')} message(s) parked, the oldest for "
            f"{figures.get('oldest_parked_seconds') or 0.0:.0f} s (the errors: the no_stale_parked_messages "
            f"check, or `cdc-pipeline failed list --sink {sink}`); retry or discard them with the jobs "
            f"{failed_job_name('retry', sink)} / {failed_job_name('discard', sink)}")


def _stopped(name: str, result: Any) -> str:
    if isinstance(result, DeliveryStats):
        return (f"delivery to {name} stopped on request: offset {position_lsn_text(result.offset)} committed, "
                f"{result.delivered} messages delivered by this run")
    return f"delivery to {name} stopped on request ({result})"


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
    store = Store(pipeline.state.schema_name)
    splits = SinkLanes(pipeline.state.schema_name)
    out = []
    with session.connect(pipeline.state_dsn, autocommit=True) as conn:
        for sink in pipeline.sinks:
            if splits.split(conn, sink.name)[0].lanes != sink.lanes:
                out += [(sink.name, lane) for lane in range(sink.lanes)]
                continue
            for lane in range(sink.lanes):
                offset = store.sink_offset(conn, sink.name, lane)
                if store.backlog(conn, sink.tables, offset, sink.name, 1) or store.due_retries(conn, sink.name, 1,
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
