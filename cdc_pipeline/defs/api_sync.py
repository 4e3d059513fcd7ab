"""API sync in Dagster: one asset per API collection (group `api_sync`) whose run backfills and then
syncs the collection until caught up, reporting progress while it runs; an asset check on its lag
against the configured ceiling; a job per API source."""

import threading
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetsDefinition,
    AssetSpec,
    Config,
    Definitions,
    MaterializeResult,
    MetadataValue,
    asset,
    asset_check,
    define_asset_job,
)

from cdc_pipeline.api_sync import lag
from cdc_pipeline.api_sync.loop import ApiSync
from cdc_pipeline.config import PipelineConfig, redact
from cdc_pipeline.config.api_sources import ApiCollectionConfig, ApiSourceConfig
from cdc_pipeline.defs.asset_data import ApiCollectionData
from cdc_pipeline.defs.resources import CdcConfigResource
from cdc_pipeline.defs.translator import CdcTranslator, asset_args

CHECK_NAME = "max_lag_within_ceiling"


class ApiSyncRunConfig(Config):
    max_seconds: float | None = None  # stop after this long (default: once caught up)
    progress_seconds: float = 5.0


def collection_metadata(pipeline: PipelineConfig, source: str, collection: str) -> dict[str, Any]:
    src = lag.collect(pipeline).get(source, {})
    if "error" in src or not src:
        return {"status": MetadataValue.text(redact(src.get("error", "not started")))}
    c = src["collections"][collection]
    return {
        "phase": c["phase"],
        "records_synced": c["records_synced"],
        "records_deleted": c["records_deleted"],
        "backfill_records": c["backfill_records"],
        "backfill_progress": MetadataValue.float(float(c["backfill_progress"] or 0.0)),
        "requests": c["requests"],
        "requests_used_of_budget": MetadataValue.text(f"{src['requests_in_window']}/{src['budget_per_window']} "
                                                      f"per {src['window_seconds']:g} s"),
        "lag_seconds": MetadataValue.float(float(c["lag_seconds"])) if c["lag_seconds"] is not None else "n/a",
        "observed_max_lag_seconds": MetadataValue.float(float(c["observed_max_lag_seconds"] or 0.0)),
        "computed_max_lag_seconds": MetadataValue.float(float(src["computed_max_lag_seconds"])),
        # Every request of the source waits this long (a 429's Retry-After or an exhausted quota, capped).
        "paused_for_seconds": MetadataValue.float(float(src["paused_for_seconds"])),
        "last_error": MetadataValue.text(redact(c["last_error"] or "")),
    }


def build_api_asset(source: ApiSourceConfig, coll: ApiCollectionConfig, spec: AssetSpec) -> AssetsDefinition:
    key = spec.key

    @asset(**asset_args(spec))
    def _sync(context: AssetExecutionContext, config: ApiSyncRunConfig, cdc: CdcConfigResource) -> MaterializeResult:
        pipeline = cdc.load()
        sync = ApiSync(pipeline, source=source.name, collections=[coll.name])
        done = threading.Event()

        def watch() -> None:  # progress while the run goes: visible in the UI as observations
            while not done.wait(config.progress_seconds):
                meta = collection_metadata(pipeline, source.name, coll.name)
                context.log_event(AssetObservation(asset_key=key, metadata=meta))
                context.log.info(f"{coll.name}: {meta.get('phase')} {meta.get('backfill_records')} records, "
                                 f"{meta.get('records_synced')} written")

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            stats = sync.run(until_idle=True, seconds=config.max_seconds)[source.name]
        finally:
            done.set()
            watcher.join()
        if not stats.collections:
            context.log.info(f"{coll.name} is being synced by another process: reporting its figures")
        return MaterializeResult(metadata={**collection_metadata(pipeline, source.name, coll.name),
                                           "run_requests": stats.requests, "run_records": stats.records})

    return _sync


def build_lag_check(source: ApiSourceConfig, coll: ApiCollectionConfig, key: AssetKey) -> Any:
    @asset_check(asset=key, name=CHECK_NAME,
                 description="The collection's lag (now minus the start of its last completed poll) is within "
                             "max_lag_seconds (default: twice the computed max lag)")
    def _check(context: AssetCheckExecutionContext, cdc: CdcConfigResource) -> AssetCheckResult:
        src = lag.collect(cdc.load()).get(source.name, {})
        c = src.get("collections", {}).get(coll.name)
        if c is None or c["lag_seconds"] is None:
            return AssetCheckResult(passed=False, severity=AssetCheckSeverity.WARN,
                                    metadata={"status": "not synced yet"})
        return AssetCheckResult(
            passed=c["lag_seconds"] <= src["max_lag_ceiling_seconds"], severity=AssetCheckSeverity.ERROR,
            metadata={"lag_seconds": float(c["lag_seconds"]), "ceiling_seconds": float(src["max_lag_ceiling_seconds"]),
                      "computed_max_lag_seconds": float(src["computed_max_lag_seconds"]),
                      "observed_max_lag_seconds": float(c["observed_max_lag_seconds"] or 0.0)})

    return _check


def api_sync_definitions(pipeline: PipelineConfig, translator: CdcTranslator) -> Definitions:
    """Per collection an asset and its lag check; per source a job."""
    assets, checks, jobs = [], [], []
    for source in pipeline.api_sources:
        keys = []
        for coll in source.collections:
            spec = translator.get_asset_spec(ApiCollectionData(pipeline, source, coll))
            assets.append(build_api_asset(source, coll, spec))
            checks.append(build_lag_check(source, coll, spec.key))
            keys.append(spec.key)
        jobs.append(define_asset_job(f"api_sync_{source.name.replace('-', '_')}", selection=keys,
                                     description=f"Sync every collection of API source {source.name}"))
    return Definitions(assets=assets, asset_checks=checks, jobs=jobs)
