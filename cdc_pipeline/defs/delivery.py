"""Per sink: a delivery asset, its job, an asset check on parked messages; and the delivery sensor."""


import psycopg
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    Backoff,
    Config,
    DagsterRunStatus,
    DefaultSensorStatus,
    Jitter,
    MaterializeResult,
    RetryPolicy,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    asset,
    define_asset_job,
    sensor,
)
from dagster import (
    JobDefinition as _Job,
)
from dagster_pyspark import PySparkResource

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.defs.resources import CdcConfigResource, sink_resource_key
from cdc_pipeline.delivery.engine import Deliverer
from cdc_pipeline.sinks.base import SinkUnavailable
from cdc_pipeline.state.store import Store

SINK_TAG = "cdc_pipeline/sink"
ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
          DagsterRunStatus.STARTED]
# Transient failures (sink down, connection refused) fail the step and are retried with backoff;
# per-message failures never get here: they are parked by the engine.
DELIVERY_RETRY = RetryPolicy(max_retries=10, delay=2, backoff=Backoff.EXPONENTIAL, jitter=Jitter.PLUS_MINUS)


class DeliveryRunConfig(Config):
    dry_run: bool = False
    max_seconds: float | None = None


def delivery_asset_key(sink_name: str) -> AssetKey:
    return AssetKey(["cdc", "delivery", sink_name])


def build_delivery_asset(sink: SinkConfig) -> AssetsDefinition:
    check_name = "no_stale_parked_messages"

    @asset(
        key=delivery_asset_key(sink.name),
        group_name="cdc_delivery",
        description=f"Delivers the change log of {', '.join(sink.tables)} to sink {sink.name} "
                    f"({sink.destination.type}).",
        retry_policy=DELIVERY_RETRY,
        check_specs=[AssetCheckSpec(check_name, asset=delivery_asset_key(sink.name),
                                    description="No message parked longer than the allowed age")],
        tags={"cdc_pipeline/kind": "delivery"},
        # The sink's own resource key differs per asset, so resources come by key, not as typed arguments.
        required_resource_keys={"cdc", "pyspark", sink_resource_key(sink.name)},
        kinds={"spark", sink.destination.type},
    )
    def _deliver(context: AssetExecutionContext, config: DeliveryRunConfig) -> MaterializeResult:
        pipeline = context.resources.cdc.load()
        pyspark: PySparkResource = context.resources.pyspark
        sink_config = pipeline.sink(sink.name)
        destination = None if config.dry_run else getattr(context.resources, sink_resource_key(sink.name)).build()
        deliverer = Deliverer(pipeline, sink_config, pyspark.spark_session, sink=destination,
                              dry_run=config.dry_run)
        try:
            stats = deliverer.run(until_idle=True, seconds=config.max_seconds)
        except SinkUnavailable as exc:
            context.log.warning(f"sink {sink.name} unavailable, will retry: {exc}")
            raise
        parked = parked_summary(pipeline, sink.name)
        max_age = pipeline.delivery.max_parked_age_seconds
        oldest = parked["oldest_parked_seconds"]
        return MaterializeResult(
            metadata={**stats.as_metadata(), **parked, "dry_run": config.dry_run},
            check_results=[AssetCheckResult(
                check_name=check_name,
                passed=oldest is None or oldest <= max_age,
                severity=AssetCheckSeverity.WARN,
                metadata={"parked": parked["parked"], "oldest_parked_seconds": oldest or 0.0,
                          "max_parked_age_seconds": max_age},
            )],
        )

    return _deliver


def parked_summary(pipeline: PipelineConfig, sink_name: str) -> dict[str, float | int | None]:
    with psycopg.connect(pipeline.state_dsn, autocommit=True) as conn:
        return Store(pipeline.state.schema_name).failed_summary(conn, sink_name)


def delivery_job_name(sink_name: str) -> str:
    return f"deliver_{sink_name.replace('-', '_')}"


def build_delivery_job(sink: SinkConfig) -> _Job:
    return define_asset_job(  # type: ignore[return-value]
        delivery_job_name(sink.name), selection=[delivery_asset_key(sink.name)],
        tags={SINK_TAG: sink.name},
    )


def lagging_sinks(pipeline: PipelineConfig) -> dict[str, tuple[int, int]]:
    """Sinks whose offset is behind the log head: name -> log head position."""
    store = Store(pipeline.state.schema_name)
    out: dict[str, tuple[int, int]] = {}
    with psycopg.connect(pipeline.state_dsn, autocommit=True) as conn:
        for sink in pipeline.sinks:
            head = store.log_head(conn, sink.tables, sink=sink.name)
            offset = store.sink_offset(conn, sink.name)
            due = store.due_retries(conn, sink.name, 1)
            if head > offset or due:
                out[sink.name] = head
    return out


def request_deliveries(context: SensorEvaluationContext, pipeline: PipelineConfig) -> list[RunRequest]:
    """One run per lagging sink, unless one is already queued or running for it."""
    requests = []
    for name, head in lagging_sinks(pipeline).items():
        active = context.instance.get_runs(
            filters=RunsFilter(tags={SINK_TAG: name}, statuses=ACTIVE), limit=1)
        if active:
            continue
        requests.append(RunRequest(
            run_key=f"{name}:{head[0]}:{head[1]}:{context.cursor or ''}",
            job_name=delivery_job_name(name),
            tags={SINK_TAG: name},
        ))
    return requests


def build_delivery_sensor(jobs: list[_Job], interval: int = 5) -> SensorDefinition:
    @sensor(name="cdc_delivery_sensor", minimum_interval_seconds=interval, jobs=jobs,
            default_status=DefaultSensorStatus.RUNNING,
            description="Launches a delivery run for each sink that lags the change log (one at a time per sink).")
    def _sensor(context: SensorEvaluationContext, cdc: CdcConfigResource):  # type: ignore[no-untyped-def]
        pipeline = cdc.load()
        requests = request_deliveries(context, pipeline)
        return requests or SkipReason("every sink is caught up or already running")

    return _sensor
