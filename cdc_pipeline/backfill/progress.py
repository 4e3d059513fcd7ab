"""What a backfill reports: the runner's Progress (progress lines, CLI result, Dagster metadata) and the
one-line description of a recorded backfill (`backfill list`, `status`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cdc_pipeline.core.backfill_origin import dagster_links
from cdc_pipeline.state.backfills import BackfillInfo, BackfillSpec

DRAIN_SENSOR = "cdc_drain_sensor"


def no_drain_warning(slot: str, pages: int, seconds: float | None, slot_exists: bool = True,
                     drain_locked: bool = False) -> str:
    """Staged pages wait for a drain that nobody runs: say so, and what to do."""
    waiting = f"{pages} staged page(s) wait for the drain, but "
    if not slot_exists:
        return waiting + f"slot {slot!r} does not exist: run `cdc-pipeline setup`, then `cdc-pipeline drain`"
    since = f" for {seconds:.0f} s" if seconds else ""
    if drain_locked:
        return (waiting + f"no process has consumed slot {slot!r}{since} although a drain process is running "
                "(it is not streaming: see its log for why)")
    return (waiting + f"no process is consuming slot {slot!r}{since} (pg_replication_slots.active is false): "
            f"start `cdc-pipeline drain`, rerun the backfill with `--drain`, or turn on the Dagster sensor "
            f"{DRAIN_SENSOR}")


@dataclass
class Progress:
    """What a runner reports while it works and when it stops."""

    backfill_id: str
    spec: BackfillSpec
    status: str  # running | paused | waiting | completing | completed | cancelled | interrupted
    resumed: bool = False
    resumed_from_page: int = 0
    pages_staged: int = 0  # pages read and staged, all runs of this backfill
    rows_staged: int = 0
    pages: int = 0  # pages reconciled by the drain (the checkpoint)
    rows_read: int = 0  # rows of reconciled pages
    rows_dropped: int = 0  # of those, dropped as stale (a change represents the row)
    page_size: int = 0
    cursor: list[str] | None = None
    estimated_rows: int | None = None
    rows_read_this_run: int = 0
    page_attempts_this_run: int = 0
    timeouts: int = 0
    seconds: float = 0.0
    note: str = ""
    # Set while staged pages wait and no process consumes the slot (see no_drain_warning).
    drain_warning: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.rows_read_this_run / self.seconds if self.seconds > 0 else 0.0

    @property
    def rows_emitted(self) -> int:
        return self.rows_read - self.rows_dropped

    def line(self) -> str:
        est = f"/~{self.estimated_rows}" if self.estimated_rows else ""
        text = (f"backfill {self.backfill_id} {self.status}: {self.rows_staged}{est} rows read in {self.pages_staged} "
                f"pages ({self.rate:,.0f} rows/s, page size {self.page_size}); checkpoint: {self.pages} pages, "
                f"{self.rows_emitted} rows emitted, {self.rows_dropped} dropped as stale, cursor {self.cursor}")
        text += f"; {self.note}" if self.note else ""
        return text + (f"; WARNING: {self.drain_warning}" if self.drain_warning else "")

    def as_metadata(self) -> dict[str, Any]:
        return {
            "backfill_id": self.backfill_id, "status": self.status, "table": self.spec.table,
            "sinks": ", ".join(self.spec.sinks), "window": self.spec.describe(),
            "rows_read": self.rows_read, "rows_emitted": self.rows_emitted, "rows_dropped": self.rows_dropped,
            "pages": self.pages, "rows_read_this_run": self.rows_read_this_run,
            "rate_rows_per_s": round(self.rate, 1), "page_size": self.page_size,
            "page_timeouts": self.timeouts, "cursor": str(self.cursor), "resumed": self.resumed,
            "resumed_from_page": self.resumed_from_page, "seconds": round(self.seconds, 2),
            "drain_warning": self.drain_warning,
        }


def describe_backfill(info: BackfillInfo, drain_warning: str = "") -> str:
    """One line per backfill, for `backfill list` and `status`."""
    window = ""
    if info.sort_column:
        window = f" by {info.sort_column}"
        if info.start is not None:
            window += f" from {info.start}"
        if info.end is not None:
            window += f" to {info.end}"
    state = info.status
    if info.status in ("running", "paused"):
        state += " (process alive)" if info.alive else " (no process: resume it)"
    percent = f" {info.percent}%" if info.percent is not None else ""
    head = f"{info.id} {info.table}{window} -> {', '.join(info.sinks)}: {state}{percent}"
    if info.checkpoint_at is None:
        text = f"{head}; no page checkpointed yet, {info.pages_staged} pages in flight"
    else:
        text = (f"{head}; {info.pages} pages checkpointed, {info.rows_read} rows read, {info.rows_dropped} dropped "
                f"as stale, {info.pages_staged} pages in flight; cursor {info.cursor}; checkpoint at "
                f"{info.checkpoint_at:%Y-%m-%d %H:%M:%S}")
    if info.origin and info.origin.startswith("drain "):  # registered by the drain: say why (a gap, a rewrite)
        text += f"; for the {info.origin}"
    links = dagster_links(info.origin)
    if links["dagster_run_id"]:
        text += f"; dagster run {links['dagster_run_id']}" + (
            f" of dagster backfill {links['dagster_backfill_id']}" if links["dagster_backfill_id"] else "")
    return text + (f"; WARNING: {drain_warning}" if drain_warning else "")
