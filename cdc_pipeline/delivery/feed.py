"""The delivery loop's read step: the next block of the log (reader.py) cut into the sink's calls; an empty
block settles what is out, looks again or waits for the drain; a run of typed reads relayed once the window
is settled."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from cdc_pipeline.delivery.reader import Reader, Staged
from cdc_pipeline.delivery.run_pass import AGAIN, SEND, STOP, Pass

log = logging.getLogger("cdc_pipeline.delivery.engine")  # the delivery's own log, as its other parts


class Feed:
    def __init__(self, reader: Reader, name: str, idle_seconds: float, resyncing: Callable[[], bool]) -> None:
        self.reader = reader
        self.name = name  # the lane's, for messages
        self.idle_seconds = idle_seconds
        self.resyncing = resyncing  # a resync backfill of the sink runs (housekeeping.py)

    def read(self, run: Pass) -> object:
        """The next block cut into calls. SEND: calls wait; AGAIN: nothing to send yet; STOP."""
        staged, prefetched = run.blocks.next(run.until_idle, time.monotonic() - run.started, run.seconds)
        if staged.rows == 0 and staged.run is None:  # a lane's block may hold none of its rows, yet move on
            return self._idle(run, prefetched)
        run.idle = False
        if staged.run is not None:  # relayed from the loader's connection: nothing loads meanwhile
            relayed = self._relay_run(run, staged)
            if not isinstance(relayed, Staged):
                return relayed
            staged = relayed
        run.calls.extend(self.reader.calls(staged))
        return SEND

    def _idle(self, run: Pass, prefetched: bool) -> object:
        """An empty block: settle what is out, look again, or wait for changes (STOP: a one-off run is done)."""
        if len(run.window):  # settle what is out before looking again
            run.settle(block=True)
            return AGAIN
        if prefetched:  # looked for while the last block was sent: look again before waiting
            return AGAIN
        resyncing = self.resyncing()
        if run.until_idle and not resyncing:
            return STOP
        if not run.idle:  # once per idle spell: what a long-running delivery is waiting for
            log.info("sink %s: caught up at %s:%s, waiting for new changes in the log%s", self.name,
                     *run.offset, " and its resync backfill" if resyncing else "")
        run.idle = True
        run.watch.wait(self.idle_seconds)  # woken by the drain's commit
        return AGAIN

    def _relay_run(self, run: Pass, staged: Staged) -> Staged | object:
        """A typed run relayed once the window is settled, under the send lock: AGAIN when done, STOP, or the run
        loaded message by message (a fallback) to send as calls."""
        run.drain()
        with run.turn.around() as got:
            if got:
                run.offset, fallback = run.blocks.relayed(run.conn, staged, run.stats)
        if not got:
            return STOP
        return AGAIN if fallback is None else fallback
