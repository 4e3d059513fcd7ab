"""Per sink, two jobs that act on its failed messages from the UI (Jobs > the job > Launchpad):
`retry_failed_messages_<sink>` makes them due for retry now (the delivery run sends them within a
second or two; the delivery sensor starts one if none runs), `discard_failed_messages_<sink>` gives up
on them (their groups flow on). The run config says which: `ids` (from the parked_messages table of the
sink's `no_stale_parked_messages` check, or `failed list`), a source `table`, or `all`.

The job does not record the check itself: Dagster keeps one check row per run, so a long-lived delivery
run's later readings update its own (older) row, and a row from this job would stay the check's latest,
showing the messages as they were a moment before the delivery run sent them, until that run ends. The
delivery run records the change within seconds (the delivery sensor starts one if none is active).
"""


from dagster import Config, Definitions, Failure, JobDefinition, OpExecutionContext, job, op

from cdc_pipeline.admin.failed import Selection, act
from cdc_pipeline.config import ConfigError, PipelineConfig, SinkConfig
from cdc_pipeline.core.positions import position_text
from cdc_pipeline.defs.health import failed_job_name, failed_op_name
from cdc_pipeline.defs.resources import CdcConfigResource
from cdc_pipeline.defs.tags import NO_RUN_RETRIES

VERBS = {"retry": "made due for retry now", "discard": "discarded"}


class FailedMessagesConfig(Config):
    ids: list[str] = []  # message IDs: commit_lsn:commit_idx (the table's `id`), or X/Y:idx
    table: str | None = None  # every failed message of this source table (schema.table)
    all: bool = False  # every parked message of the sink
    include_discarded: bool = False  # retry with table/all: revive discarded messages too


def build_failed_job(sink: SinkConfig, action: str) -> JobDefinition:
    name = failed_job_name(action, sink.name)

    @op(name=failed_op_name(action, sink.name))
    def _act(context: OpExecutionContext, config: FailedMessagesConfig, cdc: CdcConfigResource) -> None:
        pipeline = cdc.load()
        try:
            selection = Selection.parse(config.ids, config.table, config.all)
            outcome = act(pipeline, sink.name, action, selection, config.include_discarded)
        except ConfigError as exc:
            raise Failure(description=f"{name}: {exc}") from None
        context.log.info(f"sink {sink.name}: {outcome.matched} message(s) {VERBS[action]}")
        if outcome.revived_discarded:
            context.log.warning(f"{outcome.revived_discarded} discarded message(s) revived: each is delivered "
                                "after the newer versions of its row delivered since it was discarded")
        if outcome.missing:
            raise Failure(description=f"no failed message of sink {sink.name} with ID "
                                      f"{', '.join(position_text(p) for p in outcome.missing)}")

    @job(name=name, tags=NO_RUN_RETRIES,
         description=f"{action.capitalize()} failed messages of sink {sink.name}: run config ids, table or all")
    def _job() -> None:
        _act()

    return _job


def failed_definitions(pipeline: PipelineConfig) -> Definitions:
    jobs = []
    for sink in pipeline.sinks:
        jobs += [build_failed_job(sink, action) for action in ("retry", "discard")]
    return Definitions(jobs=jobs)
