"""The drain sensor: each tick streams the slot into the change log for a bounded time, records the
change log's figures on its asset, then requests delivery runs for the sinks that lag."""


from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    DefaultSensorStatus,
    JobDefinition,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from cdc_pipeline import status
from cdc_pipeline.capture.drain import Drain
from cdc_pipeline.defs.delivery import request_deliveries
from cdc_pipeline.defs.resources import CdcConfigResource

CHANGE_LOG_KEY = AssetKey(["cdc", "change_log"])

change_log_asset = AssetSpec(
    CHANGE_LOG_KEY, group_name="cdc_capture",
    description="Ordered change log in the state database, fed by the drain sensor from the replication slot.",
    kinds={"postgres"},
)


def change_log_metadata(pipeline: object, stats: object) -> dict[str, object]:
    figures = status.collect(pipeline)  # type: ignore[arg-type]
    slot = figures.get("slot") or {}
    log = figures.get("log") or {}
    return {
        "drained_changes": stats.changes, "drained_transactions": stats.transactions,  # type: ignore[attr-defined]
        "drain_rate_changes_per_s": round(stats.rate, 1),  # type: ignore[attr-defined]
        "confirmed_lsn": str(slot.get("confirmed_flush_lsn")),
        "slot_lag_bytes": slot.get("lag_bytes", 0), "slot_lag_seconds": slot.get("lag_seconds", 0.0),
        "last_heartbeat_at": str(slot.get("last_heartbeat_at")),
        "log_messages": log.get("messages", 0), "log_bytes": log.get("bytes", 0),
    }


def build_drain_sensor(jobs: list[JobDefinition]) -> SensorDefinition:
    @sensor(name="cdc_drain_sensor", minimum_interval_seconds=1, default_status=DefaultSensorStatus.RUNNING, jobs=jobs,
            description="Streams the replication slot into the change log for drain.tick_seconds per tick, "
                        "then requests delivery runs for lagging sinks.")
    def _sensor(context: SensorEvaluationContext, cdc: CdcConfigResource) -> SensorResult:
        pipeline = cdc.load()
        stats = Drain(pipeline).run(seconds=pipeline.drain.tick_seconds)
        context.log.info(f"drained {stats.changes} changes ({stats.rate:.0f}/s)")
        event = AssetMaterialization(CHANGE_LOG_KEY, metadata=change_log_metadata(pipeline, stats))
        return SensorResult(run_requests=request_deliveries(context, pipeline), asset_events=[event])

    return _sensor
