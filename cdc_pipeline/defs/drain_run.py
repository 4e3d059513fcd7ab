"""The drain resource: what the change log's drain run does, as Dagster events (as dagster-dlt's
`DagsterDltResource.run()` yields its materializations), so the change log asset's body is one line.

A run streams the slot into the change log for `drain.run_minutes` (a Materialize click: at most a bounded
catch-up, defs/materialize.py); every few seconds it reads the slot's figures and records what changed
(`LogReport`, paced by defs/pacing.py).
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
    MaterializeResult,
)

from cdc_pipeline.capture.drain import Drain, DrainStats
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.core.positions import Position, lsn_text, position_lsn_text
from cdc_pipeline.defs.handover import Handover
from cdc_pipeline.defs.health import SLOT_LAG_CHECK, log_head, log_rows, slot_check, slot_figures
from cdc_pipeline.defs.materialize import drain_elsewhere, run_bounds
from cdc_pipeline.defs.pacing import CheckGate, LogPace
from cdc_pipeline.defs.resources import CdcConfigResource
from cdc_pipeline.defs.run_metrics import run_metrics
from cdc_pipeline.defs.runs import wait_for_predecessor
from cdc_pipeline.defs.streaming import EVENT_SECONDS, stream_while
from cdc_pipeline.defs.tags import ROW_COUNT
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


class LogReport:
    """What a drain run records of the change log: a materialization when the log moved (paced), the slot
    check when it changes, and the handover when the check was executed by hand (defs/handover.py)."""

    def __init__(self, context: AssetExecutionContext, pipeline: PipelineConfig, tables: Sequence[str],
                 sources: Sequence[AssetKey], drain: Drain) -> None:
        self.context, self.pipeline, self.tables, self.sources = context, pipeline, list(tables), list(sources)
        self.key = context.asset_key
        self.pace = LogPace(pipeline.drain.report_seconds, time.monotonic())
        self.gate = CheckGate()
        self.handover = Handover(context, [AssetCheckKey(self.key, SLOT_LAG_CHECK)], self.gate.last.keys, drain.stop)

    def materialization(self, figures: dict[str, Any], head: Position) -> tuple[dict[str, Any], dict[str, str]]:
        """Metadata and tags: the stream's version, not the head's (defs/versions.py), so the sinks that keep
        up stay synced; the head is `log_head`, the log's rows `dagster/row_count`."""
        tags = provenance_tags(STREAM_VERSION, self.context.run_id, upstream_inputs(self.context.instance, self.sources))
        head_text = position_lsn_text(head)
        return {**figures, "log_head": head_text, "log_head_lsn": head_text, ROW_COUNT: log_rows(self.pipeline)}, tags

    def poll(self) -> list[Any]:
        figures = drain_figures(self.pipeline)
        head = log_head(self.pipeline, self.tables)
        events: list[Any] = []
        if self.pace.due(head, time.monotonic()):  # the log moved, and the last one is report_seconds old
            self.pace.recorded(head, time.monotonic())
            metadata, tags = self.materialization(figures, head)
            events.append(AssetMaterialization(self.key, metadata=metadata, tags=tags))
        events += self.gate.changed([slot_check(self.pipeline, self.key, figures)])
        self.handover.poll()
        return events

    def final(self, stats: DrainStats) -> Iterator[Any]:
        figures = drain_figures(self.pipeline, stats)
        metadata, tags = self.materialization(figures, log_head(self.pipeline, self.tables))
        yield slot_check(self.pipeline, self.key, figures)
        yield MaterializeResult(metadata=metadata, data_version=STREAM_VERSION, tags=tags)


class DrainResource(ConfigurableResource):
    """Runs the drain in a Dagster run and yields what it records."""

    cdc: CdcConfigResource

    def stream(self, context: AssetExecutionContext, config: DrainRunConfig, tables: Sequence[str],
               sources: Sequence[AssetKey]) -> Iterator[Any]:
        """The run: `tables` are the log's source tables, `sources` their assets' keys."""
        pipeline = self.cdc.load()
        bounds = run_bounds(context, [DRAIN_JOB], config.max_seconds or pipeline.drain.run_minutes * 60,
                            config.until_idle, lambda: drain_elsewhere(context, pipeline, [DRAIN_JOB]),
                            "the drain already streams", "no drain streams",
                            "the cdc_drain_sensor keeps the long-lived drain run")
        if bounds is None:
            return
        wait_for_predecessor(context, context.log)
        drain = Drain(pipeline)
        report = LogReport(context, pipeline, tables, sources, drain)
        context.log.info(f"draining slot {pipeline.source.slot!r} for {bounds[0]:.0f} s")
        # The same /metrics, /healthz, /readyz as `drain --metrics-port`, on the drain's port of the map.
        with run_metrics(context.log, pipeline, run_port(pipeline), lambda: [drain], [drain_streaming(drain)]):
            stats = yield from stream_while(
                "cdc-drain", lambda: drain.run(seconds=bounds[0], until_idle=bounds[1]), drain.stop, report.poll,
                EVENT_SECONDS, lambda exc: context.log.warning(f"could not read the slot's figures: {exc}"),
                lambda result: context.log.info(_stopped(result)))
        context.log.info(f"drained {stats.changes} changes ({stats.rate:.0f}/s) in {stats.seconds:.0f} s")
        yield from report.final(stats)


def _stopped(result: Any) -> str:
    if isinstance(result, DrainStats):
        return (f"drain stopped on request: log committed and slot acknowledged up to "
                f"{lsn_text(result.committed_lsn)} ({result.changes} changes drained by this run)")
    return f"drain stopped on request ({result})"
