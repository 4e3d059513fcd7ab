"""The delivery resource: what a sink's delivery run does, as Dagster events (as dagster-dlt's
`DagsterDltResource.run()` yields its materializations), so the sink asset's body is one line.

A run keeps its SparkSession warm and polls the change log as `cdc-pipeline deliver` does, for
`delivery.run_minutes` (a Materialize click: at most a bounded catch-up, defs/materialize.py); every few
seconds it reads the sink's figures and records what changed (`SinkReport`, paced by defs/pacing.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from dagster import (
    AssetCheckKey,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    Config,
    ConfigurableResource,
    DataVersion,
    MaterializeResult,
)

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.core.positions import START, position_lsn_text
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
from cdc_pipeline.defs.materialize import delivery_elsewhere, run_bounds
from cdc_pipeline.defs.pacing import CheckGate, ParkedWarning, SinkPace
from cdc_pipeline.defs.resources import CdcConfigResource, SinksResource, SparkResource
from cdc_pipeline.defs.run_metrics import run_metrics
from cdc_pipeline.defs.runs import wait_for_predecessor
from cdc_pipeline.defs.streaming import EVENT_SECONDS, stream_while
from cdc_pipeline.defs.tags import ROW_COUNT
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


class DeliveryRunConfig(Config):
    lane: int = 0  # the lane this run delivers (its job sets it: deliver_<sink>_lane<I>)
    dry_run: bool = False
    max_seconds: float | None = None  # empty: delivery.run_minutes from cdc.yaml
    until_idle: bool = False  # stop once the sink has caught up (a one-off catch-up)


class SinkReport:
    """What a delivery run records of its sink: a materialization (paced; with the provenance that makes
    the UI's "Unsynced" follow the lag, defs/versions.py), check evaluations when they change, a warning
    when messages are parked; and the handover when a check was executed by hand (defs/handover.py)."""

    def __init__(self, context: AssetExecutionContext, pipeline: PipelineConfig, sink: SinkConfig,
                 upstream: tuple[AssetKey, Sequence[AssetKey]], deliverer: Deliverer) -> None:
        self.context, self.pipeline, self.sink = context, pipeline, sink
        self.key, (self.log_key, self.others) = context.asset_key, upstream  # the change log, the snapshots
        log_key = self.log_key
        self.pace = SinkPace(pipeline.delivery.report_seconds, time.monotonic(),
                             named=latest(context.instance, self.key, log_key).version)  # its last run's
        self.gate = CheckGate()
        self.handover = Handover(context, [AssetCheckKey(self.key, n) for n in (SINK_LAG_CHECK, PARKED_CHECK)],
                                 self.gate.last.keys, deliverer.stop)
        self.parked = ParkedWarning()
        self.rate: tuple[int | None, float] = (None, time.monotonic())
        self.one_table = sink_table(sink)

    def figures(self) -> dict[str, Any]:
        figures = sink_figures(self.pipeline, self.sink)
        now, (delivered, at) = time.monotonic(), self.rate
        if delivered is not None:
            figures["throughput_msgs_per_s"] = round((figures["delivered_total"] - delivered) / max(1e-3, now - at), 1)
        self.rate = (figures["delivered_total"], now)
        return figures

    def metadata(self, figures: dict[str, Any]) -> dict[str, Any]:
        """As the UI shows it: no empty values (Dagster would print `null`); dagster/row_count is the
        messages the sink applied; dagster/column_schema for a sink holding one table's columns as they are."""
        shown = {k: v for k, v in figures.items() if v is not None and v != ""}
        columns = column_schema(self.pipeline, self.one_table) if self.one_table else {}
        return {**shown, ROW_COUNT: figures["delivered_total"], **columns}

    def provenance(self, figures: dict[str, Any], log: Recorded) -> tuple[DataVersion, str, dict[str, str]]:
        """The sink's version (its offset), the change-log version it names (the log's while it keeps up,
        its offset while behind), and the materialization's tags."""
        version = DataVersion(figures["offset"])
        log_input = (log.version or DEFAULT_VERSION) if keeps_up(self.pipeline, figures) else figures["offset"]
        inputs = {self.log_key: (log_input, log.storage_id if log_input == log.version else None),
                  **upstream_inputs(self.context.instance, self.others)}
        return version, log_input, provenance_tags(version, self.context.run_id, inputs)

    def poll(self) -> list[Any]:
        log, figures, now = latest(self.context.instance, self.log_key), self.figures(), time.monotonic()
        offset = version_position(figures["offset"]) or START
        named = self.pace.input_version(now, offset, log.version or DEFAULT_VERSION, keeps_up(self.pipeline, figures))
        events: list[Any] = []
        if named is not None:
            self.pace.recorded(offset, named, now)
            _, _, tags = self.provenance(figures, log)
            events.append(AssetMaterialization(self.key, metadata=self.metadata(figures), tags=tags))
        if self.parked.due(int(figures.get("parked") or 0), now):
            self.context.log.warning(parked_line(self.sink.name, figures))
        events += self.gate.changed(sink_checks(self.pipeline, self.key, figures, self.sink.name))
        self.handover.poll()
        return events

    def final(self, stats: DeliveryStats, dry_run: bool) -> Iterator[Any]:
        figures = self.figures()
        version, _, tags = self.provenance(figures, latest(self.context.instance, self.log_key))
        yield from sink_checks(self.pipeline, self.key, figures, self.sink.name)
        yield MaterializeResult(metadata=self.metadata({**stats.as_metadata(), **figures, "dry_run": dry_run}),
                                data_version=version, tags=tags)


class DeliveryResource(ConfigurableResource):
    """Runs a sink's delivery in a Dagster run and yields what it records. Loads the config once and
    hands it to the Spark and sink resources it is built on."""

    cdc: CdcConfigResource
    pyspark: SparkResource
    sinks: SinksResource

    def stream(self, context: AssetExecutionContext, config: DeliveryRunConfig, sink_name: str,
               upstream: tuple[AssetKey, Sequence[AssetKey]], own_jobs: Sequence[str]) -> Iterator[Any]:
        """The run: `upstream` is (the change log's key, the snapshots' keys), `own_jobs` the sink's delivery
        jobs (a run of another job is a Materialize click)."""
        pipeline = self.cdc.load()
        sink = pipeline.sink(sink_name)
        bounds = run_bounds(context, own_jobs, config.max_seconds or pipeline.delivery.run_minutes * 60,
                            config.until_idle, lambda: delivery_elsewhere(context, pipeline, sink, own_jobs),
                            f"sink {sink.name} is already being delivered", f"no delivery of {sink.name} runs",
                            "the cdc_delivery_sensor keeps the long-lived delivery runs")
        if bounds is None:
            return
        spark = self.pyspark.session(pipeline)  # before a successor waits: it takes over warm, without a gap
        wait_for_predecessor(context, context.log)
        deliverer = (DryRun(pipeline, sink, spark, lane=config.lane) if config.dry_run else
                     Deliverer(pipeline, sink, spark, sink=self.sinks.build(sink_name, pipeline), lane=config.lane))
        report = SinkReport(context, pipeline, sink, upstream, deliverer)
        # The same /metrics, /healthz, /readyz as `deliver --sink S --lane I --metrics-port`, on the lane's
        # port of the map (none for a dry run, as in the CLI).
        port = None if config.dry_run else run_port(pipeline, sink.name, config.lane)
        with run_metrics(context.log, pipeline, port, lambda: [deliverer],
                         [deliverers_not_waiting(lambda: [deliverer])]):
            stats = yield from stream_while(
                f"cdc-deliver-{deliverer.lane.name}", lambda: deliverer.run(until_idle=bounds[1], seconds=bounds[0]),
                deliverer.stop, report.poll, EVENT_SECONDS,
                lambda exc: context.log.warning(f"could not read sink {sink.name}'s figures: {exc}"),
                lambda result: context.log.info(_stopped(sink.name, result)))
        yield from report.final(stats, config.dry_run)


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
