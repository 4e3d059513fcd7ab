"""A deliverer's lane of its sink (core/lanes.py): joining it at the start of a session (changing the
sink's split first when the config asks for another number of lanes), its locks, noticing that another
process changes the split, and which messages of a batch are this lane's to send.

A sink with one lane and no earlier split behaves exactly as before lanes existed: the same lock names,
every message its own, the destination's own position under the sink's name.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import psycopg

from cdc_pipeline.core.lanes import LANE_HASH, MD5, Split, lane_name, parking_group, position_key
from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.schedule.order import position_of
from cdc_pipeline.delivery.staging import StageFailure
from cdc_pipeline.postgres import session
from cdc_pipeline.sinks.base import OutboundMessage, Sink
from cdc_pipeline.state.lanes import SinkLanes
from cdc_pipeline.state.sink_offsets import SinkOffsets

log = logging.getLogger("cdc_pipeline.delivery.engine")

SPLIT_CHECK_SECONDS = 1.0  # how often a running lane looks whether another process changes the split
SPLIT_WAIT_SECONDS = 0.5  # how often a lane waiting for the old split's lanes to stop looks again


class SinkBusy(RuntimeError):
    pass


class LockStillHeld(RuntimeError):
    """After a reconnect the lane's lock is still held: most likely by our own old session."""


def deliver_lock(name: str) -> str:
    return f"cdc_pipeline.deliver:{name}"


def send_lock(name: str) -> str:
    """Held by a delivery around each send and by a replay for its whole run: the two never interleave."""
    return f"cdc_pipeline.send:{name}"


class LaneKeeper:
    locks = True  # takes the lane's locks (a dry run takes none: dry_run.py)

    def __init__(self, sink: str, lane: int, lanes: int, offsets: SinkOffsets, stop: threading.Event) -> None:
        if not 0 <= lane < lanes:
            raise ValueError(f"sink {sink!r} has {lanes} lane(s): --lane must be 0 to {lanes - 1}, not {lane}")
        self.sink = sink
        self.lane = lane
        self.lanes = lanes
        self.offsets = offsets  # every lane's, read when the split changes
        self.splits = SinkLanes(offsets.schema)
        self.stop = stop
        self.split = Split(lanes)
        self.generation = 0
        self.name = lane_name(sink, lane, lanes)  # in locks, logs and stats
        self._checked = 0.0

    @property
    def send_lock(self) -> str:
        return send_lock(self.name)

    def join(self, conn: psycopg.Connection, sink: Sink, first: bool) -> None:
        """Take this lane's lock in the sink's current split, changing the split to ``lanes`` first if it
        differs (its old lanes are asked to stop, and waited for). Commits."""
        while True:
            self._settle(conn, sink)
            if not session.try_lock(conn, deliver_lock(self.name)):
                conn.commit()
                if not first:
                    raise LockStillHeld(f"the delivery lock of sink {self.name!r} is still held")
                raise SinkBusy(f"sink {self.name!r} is already being delivered by another process")
            split, generation, wanted = self.splits.split(conn, self.sink)
            if self._current(split) and wanted not in (None, self.lanes):
                # Asked by a process that may have gone: one still waiting asks again within a turn.
                self.splits.want(conn, self.sink, None)
            conn.commit()
            if self._current(split):  # not changed between the two looks
                self.split, self.generation = split, generation
                # Where the sink records its own position from now on (sinks/base.py SinkContext).
                sink.context.position_key = position_key(self.sink, self.lane, self.lanes, generation)
                return
            session.unlock(conn, deliver_lock(self.name))
            conn.commit()

    def _current(self, split: Split) -> bool:
        """Whether this lane can join ``split`` as it is: its number of lanes, and (with more than one) the
        lane hash of this version; a split of an older version's hash is re-split like a change of N."""
        return split.lanes == self.lanes and (self.lanes == 1 or split.hashing == LANE_HASH)

    def _settle(self, conn: psycopg.Connection, sink: Sink) -> None:
        waited = False
        while True:
            split, generation, _ = self.splits.split(conn, self.sink)
            conn.commit()
            if self._current(split) or self.stop.is_set():
                return
            self.splits.want(conn, self.sink, self.lanes)  # the old split's lanes stop at their next turn
            conn.commit()
            changer = f"cdc_pipeline.lanes:{self.sink}"  # one process changes a split at a time
            while not session.wait_lock(conn, changer, SPLIT_WAIT_SECONDS):
                if self.stop.is_set():
                    return
            old = [deliver_lock(lane_name(self.sink, j, split.lanes)) for j in range(split.lanes)]
            held = [name for name in old if session.try_lock(conn, name)]
            try:
                if len(held) == len(old):
                    self._change(conn, sink, split, generation)
                conn.commit()
            finally:
                if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                    conn.rollback()
                for name in [*held, changer]:
                    session.unlock(conn, name)
                conn.commit()
            if len(held) == len(old):
                continue
            if not waited:
                log.info("sink %s: waiting for the %d lane(s) of its current split to stop before it changes to "
                         "%d lanes", self.sink, split.lanes, self.lanes)
                waited = True
            self.stop.wait(SPLIT_WAIT_SECONDS)

    def _change(self, conn: psycopg.Connection, sink: Sink, old: Split, generation: int) -> None:
        again, gen_now, _ = self.splits.split(conn, self.sink)
        if again != old or gen_now != generation:
            return  # changed by another process meanwhile: look again
        offsets: list[Position] = []
        for j in range(old.lanes):
            offset = self.offsets.sink_offset(conn, self.sink, j)
            if sink.own_position is not None:  # what the destination committed itself may be further
                held = sink.own_position.read(position_key(self.sink, j, old.lanes, generation))
                offset = max(offset, held) if held is not None else offset
            offsets.append(offset)
        self.splits.change(conn, self.sink, old, generation, offsets, self.lanes)
        log.info("sink %s: lanes changed from %d to %d%s; every lane starts at %s:%s", self.sink, old.lanes,
                 self.lanes, "" if old.lanes == 1 or old.hashing == LANE_HASH else
                 " (to the lane hash the state database computes: each lane reads only its share)", *min(offsets))

    def superseded(self, conn: psycopg.Connection) -> bool:
        """Whether another process changes (or changed) the split: this lane then stops. Looks at most once a
        second."""
        now = time.monotonic()
        if now - self._checked < SPLIT_CHECK_SECONDS:
            return False
        self._checked = now
        split, generation, wanted = self.splits.split(conn, self.sink)
        conn.commit()
        if split.lanes == self.lanes and generation == self.generation and wanted in (None, self.lanes):
            return False
        log.warning("sink %s: its lanes are changing to %s (another process's config): lane %s stops; run it "
                    "again with the new config", self.sink, wanted or split.lanes, self.name)
        return True

    @property
    def filters(self) -> bool:
        """Whether some messages of a batch may not be this lane's to send."""
        return self.split.lanes > 1 or bool(self.split.prior)

    @property
    def hashed_in_sql(self) -> bool:
        """Whether the state database can tell this lane's log rows (its split's hash is MD5): then, for a sink
        whose groups it can compute too, the lane reads only those (state/change_log.py)."""
        return self.split.lanes > 1 and self.split.hashing == MD5

    def mine(self, messages: Sequence[OutboundMessage], failed: Sequence[StageFailure], selected: bool = False
             ) -> tuple[list[OutboundMessage], list[StageFailure]]:
        """The messages (and stage failures) of this lane that no earlier split settled. ``selected``: the
        batch holds this lane's rows only (the database chose them): only earlier splits are looked at."""
        def ours(group: str | None, position: Position) -> bool:
            parked_as = parking_group(group, position)
            return (selected or self.split.lane_of(parked_as) == self.lane) \
                and not self.split.settled_before(parked_as, position)

        return ([m for m in messages if ours(m.group, position_of(m))], [f for f in failed if ours(f[1], f[0])])
