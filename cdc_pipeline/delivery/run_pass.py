"""A delivery session's loop state, shared by its steps (engine.py `Deliverer._loop`, feed.py, housekeeping.py)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import psycopg

from cdc_pipeline.core.positions import Position
from cdc_pipeline.delivery.reader import Blocks
from cdc_pipeline.delivery.schedule.calls import Call
from cdc_pipeline.delivery.schedule.settle import Settler
from cdc_pipeline.delivery.schedule.window import CallWindow
from cdc_pipeline.delivery.stats import DeliveryStats
from cdc_pipeline.delivery.turn import SendTurn
from cdc_pipeline.state import notify

SEND, AGAIN, STOP = object(), object(), object()  # what a step of the loop says: send a call, loop again, stop


@dataclass
class Pass:
    """The loop's state over one session."""

    conn: psycopg.Connection  # the state connection: offsets, parking, the send lock
    blocks: Blocks  # the log read ahead (reader.py)
    turn: SendTurn  # the send lock, held while calls are out (turn.py)
    watch: notify.LogWatch | notify.Sleep  # woken when the drain commits new rows
    window: CallWindow
    settler: Settler
    stats: DeliveryStats
    started: float
    until_idle: bool
    seconds: float | None
    offset: Position  # settled
    calls: deque[Call] = field(default_factory=deque)  # cut from the loaded block, not handed to the window yet
    idle: bool = False
    settle_due: float = 0.0  # a wider window settles what is done this often

    def settle(self, block: bool) -> None:
        """Settle the calls done (``block``: every call out) in order; the offset follows."""
        self.offset = self.settler.settle(self.conn, self.stats, self.window, self.window.settled(block=block),
                                          self.offset)

    def drain(self) -> None:
        """Settle every call out."""
        while len(self.window):
            self.settle(block=True)

    def over_time(self) -> bool:
        """The run's time limit (``seconds``) has passed."""
        return self.seconds is not None and time.monotonic() - self.started >= self.seconds
