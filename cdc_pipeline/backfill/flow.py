"""Flow control for a backfill runner: how many pages may wait for the drain, a sink's backlog, and whether a
drain is there at all. (A page's staged rows are deleted by the drain as it logs them: state/reconciliation.py.)"""

from __future__ import annotations

import logging
import time

import psycopg

from cdc_pipeline.backfill.progress import no_drain_warning
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import catalog
from cdc_pipeline.state.backfill_pages import PageStore
from cdc_pipeline.state.backfills import BackfillSpec, BackfillStore
from cdc_pipeline.state.log_counts import LogCounts
from cdc_pipeline.state.sink_offsets import SinkOffsets

log = logging.getLogger(__name__)

BACKLOG_CHECK_SECONDS = 1.0
BACKLOG_COUNT_SECONDS = 10.0
SLOT_CHECK_SECONDS = 1.0
# A slot may be idle for a moment without anything being wrong (a drain reconnecting, the Dagster
# sensor between two runs): only an inactive slot that stays so this long is reported.
NO_DRAIN_GRACE_SECONDS = 5.0


class DrainWatch:
    """Whether anything consumes the slot while pages wait for it (``pg_replication_slots.active``)."""

    def __init__(self, slot: str, store: BackfillStore, grace: float = NO_DRAIN_GRACE_SECONDS) -> None:
        self.slot = slot
        self.store = store
        self.grace = grace
        self._inactive_since: float | None = None
        self._last_check = 0.0
        self.warning = ""

    def update(self, src: psycopg.Connection, state: psycopg.Connection, staged: int) -> str:
        """The warning to show while ``staged`` pages wait ('' when none do, or a drain consumes the slot)."""
        if staged == 0:
            self._inactive_since, self.warning = None, ""
            return ""
        now = time.monotonic()
        if now - self._last_check < SLOT_CHECK_SECONDS:
            return self.warning
        self._last_check = now
        info = catalog.slot_info(src, self.slot)
        if info is not None and info["active"]:
            self._inactive_since, self.warning = None, ""
            return ""
        if self._inactive_since is None:
            self._inactive_since = now
        idle = now - self._inactive_since
        if idle < self.grace:
            return self.warning
        first = not self.warning
        self.warning = no_drain_warning(self.slot, staged, idle + SLOT_CHECK_SECONDS, info is not None,
                                        self.store.drain_running(state, self.slot))
        if first:
            log.warning(self.warning)
        return self.warning


class Flow:
    """Backpressure for one backfill: staged pages, sink backlogs, the drain's presence."""

    def __init__(self, config: PipelineConfig, spec: BackfillSpec, store: BackfillStore) -> None:
        self.config = config
        self.spec = spec
        self.store = store
        self.offsets = SinkOffsets(config.state.schema_name)  # the sinks' backlogs
        self.change_log = LogCounts(config.state.schema_name)
        self.pages = PageStore(config.state.schema_name)
        self.drain = DrainWatch(config.source.slot, store)
        self._last_backlog_check = 0.0
        self._last_backlog_count = 0.0
        self._backlog_note = ""
        self.backlog_estimate = 0

    def staged(self, state: psycopg.Connection, bid: str) -> int:
        return self.pages.staged(state, bid)

    def watch_drain(self, src: psycopg.Connection, state: psycopg.Connection, bid: str) -> str:
        return self.drain.update(src, state, self.staged(state, bid))

    def must_wait(self, state: psycopg.Connection, bid: str, staged: int) -> str:
        """Why the next page must wait (backpressure), or ''."""
        cfg = self.config.backfill
        if staged >= cfg.max_staged_pages:
            return f"{staged} pages wait for the drain (max_staged_pages {cfg.max_staged_pages})"
        # A sink's backlog: this backfill's own share (rows in flight, and reads reconciled after the
        # sink's offset) is cheap to know from its pages and is checked every BACKLOG_CHECK_SECONDS, or
        # at once when the rows staged since say it may be over. Counting the log itself (other traffic
        # included, up to the limit) costs a scan of the backlog, so it runs every
        # BACKLOG_COUNT_SECONDS, or when our share alone comes near the limit.
        now = time.monotonic()
        limit = cfg.max_sink_backlog
        over = self.backlog_estimate > limit
        if not (over or now - self._last_backlog_check >= BACKLOG_CHECK_SECONDS):
            return self._backlog_note
        if over and self._backlog_note and now - self._last_backlog_check < BACKLOG_CHECK_SECONDS / 2:
            return self._backlog_note
        self._last_backlog_check = now
        count_log = now - self._last_backlog_count >= BACKLOG_COUNT_SECONDS
        self.backlog_estimate = 0
        self._backlog_note = ""
        for name in self.spec.sinks:
            offset = self.offsets.sink_offset(state, name)
            in_flight, ours = self.pages.backlog_share(state, bid, offset)
            backlog = in_flight + ours
            if backlog <= limit and (count_log or backlog > limit // 2):
                sink = self.config.sink(name)
                backlog = in_flight + self.change_log.backlog(state, sink.tables, offset, name, limit + 1)
                self._last_backlog_count = now
            self.backlog_estimate = max(self.backlog_estimate, backlog)
            if backlog > limit and not self._backlog_note:
                self._backlog_note = (f"sink {name} has more than {limit} undelivered messages "
                                      f"(max_sink_backlog): waiting for delivery")
        return self._backlog_note
