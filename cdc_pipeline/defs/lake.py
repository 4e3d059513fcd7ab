"""Per `delta` / `iceberg` sink, the maintenance its tables need as a Dagster job,
`maintain_lake_<sink>` (the Launchpad's config: `retain_hours`, `dry_run`), and a daily schedule for it,
stopped until a user turns it on. The job runs what `python -m cdc_pipeline.sinks.lake.maintain` runs
(sinks/lake/maintain.py: compaction, then files and snapshots older than `retain_hours` removed; safe beside
a running delivery) and records what each table holds now on the sink's asset as an observation: its
location, Delta version or Iceberg snapshot, row count and files. `dry_run` only reads those figures.
"""

from typing import Any

from dagster import (
    AssetKey,
    AssetObservation,
    Config,
    DefaultScheduleStatus,
    Definitions,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    ScheduleDefinition,
    TableColumn,
    TableRecord,
    TableSchema,
    job,
    op,
)

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.defs.asset_data import SinkData
from cdc_pipeline.defs.resources import CdcConfigResource
from cdc_pipeline.defs.tags import ROW_COUNT
from cdc_pipeline.defs.translator import CdcTranslator
from cdc_pipeline.sinks.lake.maintain import LAKE_TYPES, maintain

DAILY = "0 3 * * *"  # 03:00, the schedule's default (turn it on in the UI: Automation)

_REPORT = TableSchema(columns=[
    TableColumn("table", "string"), TableColumn("location", "string"), TableColumn("version_or_snapshot", "string"),
    TableColumn("rows", "int"), TableColumn("files_before", "int"), TableColumn("files_after", "int"),
])


class LakeMaintenanceConfig(Config):
    retain_hours: float = 168.0  # keep files and snapshots this recent (time travel, readers still running)
    dry_run: bool = False  # only read what each table holds now


def maintenance_job_name(sink_name: str) -> str:
    return f"maintain_lake_{sink_name.replace('-', '_')}"


def observation(key: AssetKey, reports: list[dict[str, Any]]) -> AssetObservation:
    """What a lake sink's tables hold now, on its asset (a table missing yet: nothing delivered to it)."""
    held = [r for r in reports if not r.get("missing")]
    metadata: dict[str, Any] = {
        "lake_tables": MetadataValue.table([TableRecord({
            "table": r["table"], "location": r["location"], "version_or_snapshot": str(r.get("version",
                                                                                          r.get("snapshot"))),
            "rows": int(r["rows"]), "files_before": int(r["files_before"]), "files_after": int(r["files_after"]),
        }) for r in held], schema=_REPORT),
        ROW_COUNT: MetadataValue.int(sum(int(r["rows"]) for r in held)),
    }
    if len(held) == 1:
        metadata["dagster/uri"] = MetadataValue.path(held[0]["location"])
    missing = [r["table"] for r in reports if r.get("missing")]
    if missing:
        metadata["tables_not_written_yet"] = MetadataValue.text(", ".join(missing))
    return AssetObservation(asset_key=key, metadata=metadata)


def build_maintenance_job(sink: SinkConfig, key: AssetKey) -> JobDefinition:
    name = maintenance_job_name(sink.name)

    @op(name=f"{name}_op")
    def _maintain(context: OpExecutionContext, config: LakeMaintenanceConfig, cdc: CdcConfigResource) -> None:
        reports = maintain(cdc.load(), sink.name, config.retain_hours, config.dry_run)
        for r in reports:
            context.log.info(f"{r['table']}: " + ("not written yet" if r.get("missing") else
                             f"{r['rows']} rows, files {r['files_before']} -> {r['files_after']}"))
        context.log_event(observation(key, reports))

    @job(name=name, description=f"Compact and clean the {sink.destination.type} tables of sink {sink.name} "
                                "(run config: retain_hours, dry_run)")
    def _job() -> None:
        _maintain()

    return _job


def lake_definitions(pipeline: PipelineConfig, translator: CdcTranslator) -> Definitions:
    jobs, schedules = [], []
    for sink in pipeline.sinks:
        if sink.destination.type not in LAKE_TYPES:
            continue
        made = build_maintenance_job(sink, translator.get_asset_spec(SinkData(pipeline, sink)).key)
        jobs.append(made)
        schedules.append(ScheduleDefinition(
            name=f"{made.name}_daily", job=made, cron_schedule=DAILY, default_status=DefaultScheduleStatus.STOPPED,
            description=f"Compacts and cleans the tables of sink {sink.name} every day at 03:00 (turn it on in "
                        "Automation)"))
    return Definitions(jobs=jobs, schedules=schedules)
