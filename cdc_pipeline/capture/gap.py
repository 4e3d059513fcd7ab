"""A gap: the state database's progress is behind what the slot has confirmed.

The drain acknowledges the slot only after the log commits, so this happens when the state database was
restored from an older backup (or the slot was advanced by hand): the transactions between the two
positions were acknowledged, the slot cannot replay them, and the log does not hold them. The drain never
streams past a gap silently. ``drain.on_gap``:

* ``stop``: exit non-zero naming the tables and the LSN range, proposing a backfill;
* ``backfill``: in one state transaction, register a full backfill of every configured table that a sink
  receives, write a ``truncate`` of each at the gap (so a mirror also drops rows deleted during the
  gap; other sinks ignore truncates) and accept the slot's position. The backfills then run in threads
  of this drain process, which reconciles their pages as usual; a drain restarted before they finish
  resumes them (they are the durable record of the gap: origin ``drain gap A..B``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import session
from cdc_pipeline.postgres.replication import int_to_lsn
from cdc_pipeline.state import slot_progress

log = logging.getLogger(__name__)

ORIGIN = "drain gap"


@dataclass(frozen=True)
class Gap:
    committed: int  # the state database's progress
    confirmed: int  # the slot's confirmed_flush_lsn
    tables: tuple[str, ...]

    def describe(self) -> str:
        return (f"changes committed between LSN {int_to_lsn(self.committed)} and {int_to_lsn(self.confirmed)} "
                f"to {', '.join(self.tables)}")

    @property
    def origin(self) -> str:
        return f"{ORIGIN} {int_to_lsn(self.committed)}..{int_to_lsn(self.confirmed)}"


def stop_message(config: PipelineConfig, gap: Gap) -> str:
    tables = " ".join(gap.tables)
    return (f"gap in the change log: the state database's progress (LSN {int_to_lsn(gap.committed)}) is behind "
            f"replication slot {config.source.slot!r} (confirmed LSN {int_to_lsn(gap.confirmed)}); was the state "
            f"database restored from an older backup? The slot cannot replay the {gap.describe()}: they are "
            f"not in the log, and the drain will not stream past them. Fix: backfill those tables: set "
            f"`drain.on_gap: backfill` and start the drain again (it accepts the slot's position and backfills "
            f"{tables}), or accept it by hand and run `cdc-pipeline backfill TABLE` for each")


def record(config: PipelineConfig, source: psycopg.Connection, gap: Gap) -> list[str]:
    """Register the gap's backfills, truncate markers and the new progress in one state transaction.
    Returns the tables that get a backfill (a table no sink receives has nothing to backfill into)."""
    from cdc_pipeline.backfill.request import BackfillRequest, resolve, table_shape
    from cdc_pipeline.state.backfills import BackfillStore

    store = BackfillStore(config.state.schema_name)
    now = datetime.now(UTC)
    queued: list[str] = []
    claimed: list[str] = []
    with session.connect(config.state_dsn, durable=True, application_name="cdc_pipeline.drain") as state:
        with state.transaction():
            for i, table in enumerate(gap.tables):
                if not any(table in s.tables for s in config.sinks):
                    log.warning("gap: no sink receives %s: nothing to backfill", table)
                    continue
                spec = resolve(config, BackfillRequest(table, origin=gap.origin))
                shape = table_shape(source, spec, config.source.publication)
                bid, _ = store.claim(state, spec, shape.primary_key, shape.keyset, gap.origin, None)
                claimed.append(bid)
                # Just before the slot's position, after everything the log holds (see the module doc).
                slot_progress.skip_gap(state, store.schema, spec.schema_name, spec.table_name,
                                       (gap.confirmed - 1, i), now, bid)
                queued.append(table)
            slot_progress.accept(state, store.schema, config.source.slot, gap.confirmed)
        # The runner locks claim() took, released once committed (closing the session would release them
        # only when its backend has exited, after the drain's threads may have looked): they take them over.
        for bid in claimed:
            store.release(state, bid)
    return queued


class GapBackfills:
    """Runs the active gap backfills of this pipeline in threads of the drain process."""

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        self._threads: dict[str, threading.Thread] = {}
        self._runners: dict[str, object] = {}
        self.errors: list[str] = []

    def pending(self, state: psycopg.Connection) -> list[tuple[str, str]]:
        """(id, schema.table) of active gap backfills no process is running."""
        from cdc_pipeline.state.backfills import BackfillStore

        # Every backfill the drain registered: a gap's, or a schema change's (capture/rereads.py).
        orphans = BackfillStore(self.config.state.schema_name).orphans(state, "drain %")
        state.commit()
        return orphans

    def start(self, state: psycopg.Connection) -> None:
        from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest

        for bid, table in self.pending(state):
            thread = self._threads.get(table)
            if thread is not None and thread.is_alive():
                continue
            runner = Backfiller(self.config, BackfillRequest(table, origin=ORIGIN), wait_if_busy=True)
            self._runners[table] = runner

            def run(runner: Backfiller = runner, bid: str = bid) -> None:
                try:
                    progress = runner.run()
                    log.warning("gap backfill %s of %s: %s", bid, runner.spec.table, progress.status)
                except BaseException as exc:  # the next drain session resumes it
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    log.warning("gap backfill %s failed (%s); it resumes with the next drain session", bid, exc)

            log.warning("gap: backfilling %s (backfill %s) in this drain process", table, bid)
            self._threads[table] = thread = threading.Thread(target=run, name=f"gap-backfill-{table}", daemon=True)
            thread.start()

    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads.values())

    def signal_stop(self) -> None:
        for runner in self._runners.values():
            runner.stop()  # type: ignore[attr-defined]

    def stop(self, timeout: float = 60) -> None:
        self.signal_stop()
        for thread in self._threads.values():
            thread.join(timeout)

