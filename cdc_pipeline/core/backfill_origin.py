"""Who asked for a backfill, as its `origin` column says: 'cli', or a Dagster run. A Dagster origin names
the run (and the run it retries), the Dagster backfill it belongs to and its partition, so `status` and
`backfill list` point at them; the run, in turn, is tagged with the pipeline's backfill id (defs/backfill.py).
Pure."""

from __future__ import annotations

import re

DAGSTER_RUN = re.compile(r"^dagster run (?P<run>[0-9a-f-]+)(?: \(retry of (?P<root>[0-9a-f-]+)\))?"
                         r"(?:, dagster backfill (?P<backfill>\S+?))?(?:, partition (?P<partition>.+))?$")


def dagster_origin(run_id: str, root_run_id: str | None = None, backfill_id: str | None = None,
                   partition: str | None = None) -> str:
    text = f"dagster run {run_id}" + (f" (retry of {root_run_id})" if root_run_id else "")
    if backfill_id:
        text += f", dagster backfill {backfill_id}"
    return text + (f", partition {partition}" if partition else "")


def dagster_links(origin: str | None) -> dict[str, str | None]:
    """The Dagster run (the first one, which a retry resumes), backfill and partition an origin names;
    all None for an origin that is not a Dagster run's."""
    found = DAGSTER_RUN.match(origin or "")
    if found is None:
        return {"dagster_run_id": None, "dagster_backfill_id": None, "dagster_partition": None}
    return {"dagster_run_id": found["root"] or found["run"], "dagster_backfill_id": found["backfill"],
            "dagster_partition": found["partition"]}


def started_by(origin: str | None, run_id: str, root_run_id: str | None) -> bool:
    """Whether a backfill with this origin is the one a run (or the run it retries) started."""
    found = DAGSTER_RUN.match(origin or "")
    if found is None:
        return False
    ours = {run_id, root_run_id} - {None}
    return bool({found["run"], found["root"]} & ours)
