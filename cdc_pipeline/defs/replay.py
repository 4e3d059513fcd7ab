"""The `cdc_replay` job: replay a commit-time window of the change log to one sink from the UI.

The run config picks the sink, the window (`start`, optional `end`, ISO 8601, UTC without a zone) and
optionally one table; the op runs the same code as `cdc-pipeline replay` (delivery/replay.py). A window
before the retained log fails the run with the oldest replayable time.
"""

from dagster import Config, Definitions, Failure, MetadataValue, OpExecutionContext, job, op

from cdc_pipeline.config import ConfigError
from cdc_pipeline.defs.resources import CdcConfigResource, SinksResource, SparkResource
from cdc_pipeline.defs.tags import REPLAY_TAGS
from cdc_pipeline.delivery.plan import SinkPlan
from cdc_pipeline.delivery.replay import ReplayRefused, parse_time, replay

REPLAY_JOB = "cdc_replay"


class ReplayConfig(Config):
    sink: str
    start: str  # e.g. 2026-11-23T14:05:00Z
    end: str | None = None  # exclusive; empty: up to now
    table: str | None = None  # only this table's changes


@op(name="replay_window", tags=REPLAY_TAGS)
def replay_op(context: OpExecutionContext, config: ReplayConfig, cdc: CdcConfigResource,
              pyspark: SparkResource, sinks: SinksResource) -> None:
    pipeline = cdc.load()
    try:
        sink_config = pipeline.sink(config.sink)
        spark = pyspark.spark_session if SinkPlan.build(pipeline, sink_config).needs_record else None
        stats = replay(pipeline, config.sink, parse_time(config.start),
                       parse_time(config.end) if config.end else None, config.table, spark=spark,
                       sink=sinks.build(config.sink))
    except (ReplayRefused, ConfigError) as exc:
        raise Failure(description=str(exc)) from None
    metadata = {k: MetadataValue.text(str(v)) if isinstance(v, list | type(None)) else v
                for k, v in stats.as_metadata().items()}
    context.add_output_metadata(metadata)
    context.log.info(f"replayed to sink {config.sink}: {stats.as_metadata()}")
    if stats.failed:
        raise Failure(description=f"{stats.failed} message(s) failed during the replay: {stats.errors[:3]}",
                      metadata=metadata)


@job(name=REPLAY_JOB, description="Re-deliver the retained changes of a commit-time window to one sink")
def replay_job() -> None:
    replay_op()


def replay_definitions() -> Definitions:
    return Definitions(jobs=[replay_job])
