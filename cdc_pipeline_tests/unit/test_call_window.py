"""The scheduler's property (delivery/schedule/: calls.py, window.py, dispatch.py, requests.py): a block cut into
calls loses and moves nothing; calls out at once from many threads, and a request sink's requests out at once on
its event loop (cut to its `batch_size`, up to its `max_in_flight`), hand each group to the sink exactly as a
call-at-a-time engine would, never a group's message before its earlier one's outcome is known, never past its
failure; a sink whose calls are not `ordered` never gets two messages of a group in one call; calls settle in
order. The sink here is an in-memory destination with latency and poison keys."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_pipeline.delivery.schedule.calls import Call, cut
from cdc_pipeline.delivery.schedule.dispatch import Dispatch, deliver_in_order
from cdc_pipeline.delivery.schedule.order import HELD, position_of
from cdc_pipeline.delivery.schedule.requests import Requests, Stopped
from cdc_pipeline.delivery.schedule.window import CallWindow
from cdc_pipeline.sinks.base import (
    NOT_SENT,
    EventLoopThread,
    Limits,
    OutboundMessage,
    Sink,
    SinkUnavailable,
    Unreachable,
)
from cdc_pipeline.sinks.request_sink import RequestSink, Sent

T0 = datetime(2026, 11, 26)


def message(pos: tuple[int, int], group: str | None) -> OutboundMessage:
    return OutboundMessage(f"{pos[0]}:{pos[1]}", group, None, b"{}")


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(0, 60), size=st.integers(1, 25), data=st.data())
def test_a_block_cut_into_calls_loses_and_moves_nothing(rows: int, size: int, data: st.DataObject) -> None:
    positions = [(100 + i // 3, i % 3) for i in range(rows)]
    kept = sorted(data.draw(st.sets(st.integers(0, max(rows - 1, 0)), max_size=rows)) if rows else [])
    failed_rows = set(data.draw(st.sets(st.sampled_from(kept), max_size=len(kept))) if kept else [])
    messages = [message(positions[i], f"g{i % 4}") for i in kept if i not in failed_rows]
    failed = [(positions[i], f"g{i % 4}", "boom") for i in sorted(failed_rows)]
    calls = cut(positions, lambda i: T0 + timedelta(seconds=i), messages, failed, size)
    assert sum(c.read for c in calls) == rows
    assert all(0 < c.read <= size for c in calls)
    assert [c.last for c in calls] == [positions[min(e, rows) - 1] for e in range(size, rows + size, size)]
    assert [m for c in calls for m in c.messages] == messages  # each once, in order
    assert [f for c in calls for f in c.stage_failed] == failed
    start = (0, -1)
    for c in calls:
        assert all(start < position_of(m) <= c.last for m in c.messages)
        assert all(start < f[0] <= c.last for f in c.stage_failed)
        assert c.filtered == c.read - len(c.messages) - len(c.stage_failed) >= 0
        assert c.last_ts == T0 + timedelta(seconds=positions.index(c.last))
        start = c.last


class Destination(Sink):
    """Acknowledges each message after a random pause, refuses the poison keys, and stops at its first
    failure of a call, as a sink sending one request after another does: the rest NOT_SENT, or (at random)
    no results for them at all (a prefix). Records every message it was handed, with when its call began and
    ended."""

    name = "memory"

    def __init__(self, poison: set[str], seed: int) -> None:
        self.poison = poison
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.clock = 0
        self.sent: list[tuple[str, str | None, int]] = []  # (key, group, tick the call began)
        self.ended: dict[str, int] = {}  # key -> tick its call ended
        self.out = 0
        self.peak = 0
        self.ordered = True

    def limits(self) -> Limits:
        return Limits(ordered=self.ordered)

    def tick(self) -> int:
        with self.lock:
            self.clock += 1
            return self.clock

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        began, pause = self.begin()
        time.sleep(pause)  # the destination's latency: calls overlap and finish in any order
        return self.end(batch, began)

    def begin(self) -> tuple[int, float]:
        began = self.tick()
        with self.lock:
            self.out += 1
            self.peak = max(self.peak, self.out)
            return began, self.random.random() * 0.002

    def prefix_only(self) -> bool:
        with self.lock:
            return self.random.random() < 0.5

    def end(self, batch: Sequence[OutboundMessage], began: int) -> list[str | None]:
        if not self.ordered:  # a call that is not `ordered` holds one message per group at most
            own = [m.group for m in batch if m.group is not None]
            assert len(own) == len(set(own)), own
        results: list[str | None] = []
        prefix = self.prefix_only()
        for m in batch:
            if any(r is not None for r in results):
                if prefix:
                    break  # the results end at the failure: the scheduler counts the rest not attempted
                results.append(NOT_SENT)
                continue
            with self.lock:
                self.sent.append((m.key, m.group, began))
            results.append(f"refused {m.key}" if m.key in self.poison else None)
        ended = self.tick()
        with self.lock:
            self.out -= 1
            for m, r in zip(batch, results, strict=False):  # (a prefix)
                if r is not NOT_SENT:
                    self.ended[m.key] = ended
        return results


class Requested(RequestSink):
    """The destination taking requests on an event loop, as a webhook or SQS does (sinks/request_sink.py)."""

    name = "requests"

    def __init__(self, destination: Destination) -> None:
        self.destination = destination
        self._runner: EventLoopThread | None = None

    def loop(self) -> EventLoopThread:
        if self._runner is None:
            self._runner = EventLoopThread("test-requests")
        return self._runner

    async def send(self, batch: Sequence[OutboundMessage]) -> Sent:
        began, pause = self.destination.begin()
        await asyncio.sleep(pause)
        return Sent(self.destination.end(batch, began))

    def close(self) -> None:
        if self._runner is not None:
            self._runner.stop()


def run_window(calls: list[Call], width: int, parked: set[str | None], poison: set[str], seed: int,
               kind: str = "calls", batch_size: int = 1) -> tuple[Destination, list[Call], dict[str, str | None]]:
    """Drive the window as the engine's loop does; the calls settled in order and each message's outcome. `kind`:
    "calls" (a sink taking `width` calls at once), "unordered" (the same, its calls not `ordered`), "requests"
    (a request sink: `width` requests of `batch_size` out at once, and as many calls)."""
    sink = Destination(poison, seed)
    sink.ordered = kind != "unordered"
    target: Sink = Requested(sink) if kind == "requests" else sink
    dispatch = Dispatch(target, Limits(batch_size, width, sink.ordered))
    window = CallWindow(lambda msgs, kept: dispatch(msgs, kept) if msgs else [], width, 10_000)
    window.reset(parked)
    settled = []
    try:
        for call in calls:
            while not window.room(call):
                settled += window.make_room(call)
            window.submit(call)
            settled += window.settled(block=False)
        while len(window):
            settled += window.settled(block=True)
    finally:
        window.close()
        target.close()
    outcome: dict[str, str | None] = {}
    for o in settled:
        part = o.outcome()
        outcome.update({m.key: r for m, r in zip(part.sent, part.results, strict=True)})
        outcome.update({m.key: HELD for m in part.held})
    return sink, [o.call for o in settled], outcome


calls_of = st.lists(st.lists(st.sampled_from([None, "a", "b", "c", "d", "e", "f"]), min_size=0, max_size=6),
                    min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(groups=calls_of, width=st.sampled_from([2, 3, 8, 100]), seed=st.integers(0, 2**32),
       poison_rate=st.sampled_from([0.0, 0.1, 0.3]), parked=st.sets(st.sampled_from(["a", "f"])),
       kind=st.sampled_from(["calls", "unordered", "requests"]), batch_size=st.integers(1, 4))
def test_many_calls_out_hand_each_group_over_as_one_call_at_a_time_would(
        groups: list[list[str | None]], width: int, seed: int, poison_rate: float, parked: set[str], kind: str,
        batch_size: int) -> None:
    rnd = random.Random(seed)
    calls: list[Call] = []
    lsn = 1000
    for i, call_groups in enumerate(groups):
        msgs = [message((lsn + j, 0), g) for j, g in enumerate(call_groups)]
        lsn += len(call_groups) + 1
        calls.append(Call((lsn, 0), T0, len(msgs) + 1, 1, msgs, []))
        assert i == len(calls) - 1
    poison = {m.key for c in calls for m in c.messages if rnd.random() < poison_rate}

    sink, settled, outcome = run_window(calls, width, set(parked), poison, seed, kind, batch_size)
    serial_sink, _, serial_outcome = run_window(calls, 1, set(parked), poison, seed)

    assert settled == calls  # every call settled, in order
    expected, reaching = model(calls, set(parked), poison)
    assert outcome == expected  # what the ordering policy says, computed without the window
    assert outcome == serial_outcome  # the same outcome as one call at a time, message by message
    by_group: dict[str | None, list[str]] = {}
    for key, group, _ in sink.sent:
        by_group.setdefault(group, []).append(key)
    serial_by_group: dict[str | None, list[str]] = {}
    for key, group, _ in serial_sink.sent:
        serial_by_group.setdefault(group, []).append(key)
    for group in set(by_group) | set(serial_by_group):
        if group is not None:  # the same messages of each group reached the destination, in the same order
            assert by_group.get(group) == serial_by_group.get(group), group
    last: dict[str, tuple[int, int]] = {}  # each group's last message sent: (its sink call's start, end)
    for key, group, began in sorted(sink.sent, key=lambda s: position_of(message_by(s[0]))):
        if group is None:
            continue
        before = last.get(group)
        # a group's message went out in the same sink call as its earlier one (the sink keeps that order),
        # or once that call had returned
        assert before is None or began == before[0] or began > before[1], (group, key)
        last[group] = (began, sink.ended[key])
    for group in parked:
        assert group not in by_group  # a parked group's messages are held, none sent
    for group, keys in reaching.items():  # each group reached the destination up to its first failure
        assert by_group.get(group, []) == keys, group
    assert sink.peak <= width


def model(calls: list[Call], parked: set[str | None], poison: set[str]
          ) -> tuple[dict[str, str | None], dict[str, list[str]]]:
    """The ordering policy on its own, message by message in log order: a group parked before, or with a
    refused message earlier, holds its later messages (HELD, never sent); a poison message is refused; any
    other is delivered (an ungrouped message holds nothing). Also what of each group reaches the
    destination: its messages up to and including its first refused one."""
    failed = {g for g in parked if g is not None}
    outcome: dict[str, str | None] = {}
    reaching: dict[str, list[str]] = {}
    for call in calls:
        for m in call.messages:
            if m.group is not None and m.group in failed:
                outcome[m.key] = HELD
                continue
            if m.group is not None:
                reaching.setdefault(m.group, []).append(m.key)
            outcome[m.key] = f"refused {m.key}" if m.key in poison else None
            if m.key in poison and m.group is not None:
                failed.add(m.group)
    return outcome, reaching


def message_by(key: str) -> OutboundMessage:
    return message(position_of(OutboundMessage(key, None, None, b"")), None)


def test_the_window_fills_with_calls_of_other_groups() -> None:
    """Calls of distinct groups are all out at once (what makes a sink with batch_size 1 fast), and no more
    than the width."""
    calls = [Call((2000 + i, 0), T0, 1, 0, [message((2000 + i, 0), f"g{i}")], []) for i in range(40)]
    gate = threading.Barrier(8, timeout=60)

    class Gated(Destination):
        arrived = 0

        def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
            # The first 8 calls to arrive wait until 8 are out at once. Counted by arrival, not read off the
            # clock: a 9th call that saw the clock still low would wait for partners that never come.
            with self.lock:
                self.arrived += 1
                first = self.arrived <= 8
            if first:
                gate.wait()
            return super().deliver(batch)

    sink = Gated(set(), 1)
    window = CallWindow(lambda msgs, kept: deliver_in_order(sink, msgs, kept), 8, 10_000)
    window.reset(set())
    done = []
    try:
        for call in calls:
            while not window.room(call):
                done += window.make_room(call)
            window.submit(call)
        while len(window):
            done += window.settled(block=True)
    finally:
        window.close()
    assert [o.call for o in done] == calls
    assert len(sink.sent) == 40
    assert sink.peak <= 8


class Flaky(RequestSink):
    """Requests that say the destination is down for the keys in `down` (at once), acknowledge the rest later."""

    name = "flaky"

    def __init__(self, down: set[str], gate: threading.Event | None = None) -> None:
        self.down, self.gate, self.sent = down, gate, []
        self._runner = EventLoopThread("test-flaky")

    def loop(self) -> EventLoopThread:
        return self._runner

    async def send(self, batch: Sequence[OutboundMessage]) -> Sent:
        self.sent += [m.key for m in batch]
        if any(m.key in self.down for m in batch):
            return Sent([Unreachable("503")] * len(batch), "endpoint answered 503")
        await asyncio.sleep(0.01)
        if self.gate is not None:
            self.gate.set()  # a request went out: the test stops the run now
            await asyncio.sleep(0.05)
        return Sent([None] * len(batch))

    def close(self) -> None:
        self._runner.stop()


def test_a_request_saying_down_beside_acknowledged_ones_fails_alone_and_a_down_destination_stops_the_call() -> None:
    batch = [message((3000 + i, 0), f"g{i}") for i in range(40)]
    sink = Flaky({batch[5].key})
    try:
        results = Requests(sink, 1, 8).deliver(batch)  # the others out beside it were acknowledged after it
        assert results[5] == "503" and all(r is None for i, r in enumerate(results) if i != 5)
        sink.down = {m.key for m in batch}
        sink.sent = []
        with pytest.raises(SinkUnavailable, match="503"):
            Requests(sink, 1, 8).deliver(batch)
        assert len(sink.sent) <= 8  # what was out when it said so; nothing after
    finally:
        sink.close()


def test_a_stopping_run_sends_no_more_requests_of_a_call() -> None:
    batch = [message((4000 + i, 0), f"g{i}") for i in range(40)]
    stop = threading.Event()
    sink = Flaky(set(), stop)
    try:
        with pytest.raises(Stopped):
            Requests(sink, 1, 4, stop).deliver(batch)
        assert len(sink.sent) <= 4  # the requests out when it stopped finish; no other goes
    finally:
        sink.close()
