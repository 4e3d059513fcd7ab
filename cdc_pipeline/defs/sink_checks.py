"""A sink's checks as definitions of their own, so the UI can execute them by hand (the Checks tab's
Execute button): `lag_below_max` and `no_stale_parked_messages`. The delivery run records their
evaluations while it streams (defs/delivery.py, paced by defs/pacing.py), and the delivery sensor when
no run is alive; executed by hand, a check reads the same figures once."""


from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetChecksDefinition, AssetKey, asset_check

from cdc_pipeline.config import SinkConfig
from cdc_pipeline.defs.health import PARKED_CHECK, SINK_LAG_CHECK, sink_checks, sink_figures
from cdc_pipeline.defs.resources import CdcConfigResource

DESCRIPTIONS = {
    SINK_LAG_CHECK: "The oldest undelivered change is at most delivery.max_lag_seconds old",
    PARKED_CHECK: "No message parked (WARN as soon as one is; ERROR once one is parked longer than "
                  "delivery.max_parked_age_seconds). Its metadata lists the parked messages; the jobs "
                  "`retry_failed_messages_<sink>` and `discard_failed_messages_<sink>` act on them.",
}


def build_sink_check(sink: SinkConfig, key: AssetKey, name: str) -> AssetChecksDefinition:
    @asset_check(asset=key, name=name, description=DESCRIPTIONS[name])
    def _check(context: AssetCheckExecutionContext, cdc: CdcConfigResource) -> AssetCheckResult:
        pipeline = cdc.load()
        [evaluation] = [e for e in sink_checks(pipeline, key, sink_figures(pipeline, pipeline.sink(sink.name)),
                                                sink.name) if e.check_name == name]
        return AssetCheckResult(passed=evaluation.passed, severity=evaluation.severity,
                                description=evaluation.description, metadata=evaluation.metadata)

    return _check


def build_sink_checks(sink: SinkConfig, key: AssetKey) -> list[AssetChecksDefinition]:
    return [build_sink_check(sink, key, name) for name in (SINK_LAG_CHECK, PARKED_CHECK)]
