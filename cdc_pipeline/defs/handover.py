"""A streaming run hands over to a fresh run when one of its checks was executed by hand.

Dagster keeps one record of a check per run, and the UI shows a check's newest record. A streaming run
updates its own record at every change; a check executed by hand (the Checks tab's Execute) makes a new
record in its own run, which would stay the check's latest, showing that one reading, until the streaming
run ended (up to `run_minutes`), whatever the stream saw after. So when a streaming run sees a newer
record of one of its checks from another run, it asks its sensor for its successor at once (the handover
near a run's end, defs/runs.py: the successor starts warm and takes over without a gap) and ends as soon
as the successor waits; the successor's first readings make new records, and the stream's state is the
latest again within a run's start-up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dagster import AssetCheckKey, DagsterRunStatus, RunsFilter

from cdc_pipeline.defs.tags import AFTER_TAG, DELIVERY, DRAIN, HANDOVER_TAG, KIND_TAG, SENSOR_NAME_TAG

STREAMING = (DRAIN, DELIVERY)


class Handover:
    """Read at every poll of a streaming run; `recorded()` names the checks this run has records of,
    `stop()` ends its work."""

    def __init__(self, context: Any, checks: Sequence[AssetCheckKey], recorded: Callable[[], Iterable[str]],
                 stop: Callable[[], None]) -> None:
        self.context, self.checks, self.recorded, self.stop = context, list(checks), recorded, stop
        self.asked = self.stopping = False

    def poll(self) -> None:
        if self.stopping or self.context.run.tags.get(SENSOR_NAME_TAG) is None:
            return  # only a sensor's run has a successor to hand over to
        if not self.asked:
            reason = self._newer_record()
            if reason is None:
                return
            self.context.log.info(f"{reason}: handing over to a fresh run, whose readings will be the check's "
                                  "latest again")
            self.context.instance.add_run_tags(self.context.run_id, {HANDOVER_TAG: reason})
            self.asked = True
        waiting = self.context.instance.get_run_records(
            RunsFilter(tags={AFTER_TAG: self.context.run_id}, statuses=[DagsterRunStatus.STARTED]), limit=1)
        if waiting:
            self.context.log.info(f"run {waiting[0].dagster_run.run_id} takes over: this run ends")
            self.stopping = True
            self.stop()

    def _newer_record(self) -> str | None:
        """Why to hand over: a check of this run's whose newest record is a run's that does not stream (a
        check executed by hand); another streaming run's (a lane of the same sink) is no reason."""
        own = set(self.recorded())
        keys = [k for k in self.checks if k.name in own]
        latest = self.context.instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
        for key, record in latest.items():
            if record.run_id in (self.context.run_id, ""):
                continue
            run = self.context.instance.get_run_by_id(record.run_id)
            if run is not None and run.tags.get(KIND_TAG) not in STREAMING:
                return f"check {key.name} was executed by run {record.run_id}"
        return None
