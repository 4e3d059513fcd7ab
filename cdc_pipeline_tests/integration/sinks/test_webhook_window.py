"""The webhook's window of requests (issue 23) against a real local HTTP server: up to `max_in_flight`
requests outstanding and never more, a failure or an outage in the middle of a full window isolated to
what it must affect, no group ever acknowledged out of order, nothing reported delivered that was not."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
from cdc_pipeline.delivery.schedule.order import HELD
from cdc_pipeline.sinks.base import NOT_SENT
from cdc_pipeline_tests.integration.sinks.test_sink_webhook import Receiver, keys, webhook
from cdc_pipeline_tests.integration.sinks.test_sinks_brokers import messages


class Counting(Receiver):
    """Counts requests in flight (peak). `hold` keeps each request open until `fill` requests were in
    flight at once (then answers at once: a deterministic full window, however loaded the machine), or
    for `delay` seconds."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.peak = 0
        self.gate = threading.Condition()

    def hold(self, status: int, body: bytes, delay: float = 0.0, fill: int | None = None) -> tuple[int, bytes, float]:
        with self.gate:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.gate.notify_all()
            if fill is not None:  # a deadline only so that a broken window fails instead of hanging
                assert self.gate.wait_for(lambda: self.peak >= fill, 60), f"only {self.peak} in flight"
        if delay:
            threading.Event().wait(delay)  # the endpoint's latency, inside the request
        with self.gate:
            self.in_flight -= 1
        return status, body, 0.0


@pytest.fixture
def counting() -> Iterator[Counting]:
    r = Counting()
    yield r
    r.stop()


def acked_in_order(receiver: Receiver, batch: list) -> None:
    """Each group's acknowledged messages are a prefix of its messages, in commit order."""
    position = {k: i for i, k in enumerate(keys(batch))}
    group_of = {k: m.group for k, m in zip(keys(batch), batch, strict=True)}
    seen: dict[str | None, list[int]] = {}
    for k in receiver.acked_keys():
        seen.setdefault(group_of[k], []).append(position[k])
    for g, got in seen.items():
        if g is None:
            continue
        mine = [i for i, m in enumerate(batch) if m.group == g]
        assert got == mine[:len(got)], f"group {g} acknowledged out of order: {got}"


def test_a_poison_message_in_the_middle_of_a_full_window_fails_only_its_group(counting: Counting) -> None:
    batch = messages(300, groups=100)  # 100 groups x 3, one message per request
    poison = batch[150].payload  # group g50's second message
    counting.behaviour = lambda h, b: counting.hold(500 if poison in b else 200, b"{}", fill=100)
    with webhook(counting.url, batch_size=1, max_in_flight=100, timeout_ms=120000) as sink:
        results = deliver_in_order(sink, batch)
    assert counting.peak == 100, counting.peak  # the window was full, and never more than full
    assert results[150] == "HTTP 500: {}"
    assert results[250] == HELD  # g50's third: behind its failure, never sent
    assert all(r is None for i, r in enumerate(results) if i not in (150, 250))
    acked = counting.acked_keys()
    assert sorted(acked) == sorted(k for i, k in enumerate(keys(batch)) if i not in (150, 250))  # each once
    acked_in_order(counting, batch)


def test_ungrouped_messages_fill_the_window_and_no_more(counting: Counting) -> None:
    counting.behaviour = lambda h, b: counting.hold(200, b"{}", 0.01, fill=7)
    batch = messages(120, groups=0)
    with webhook(counting.url, batch_size=2, max_in_flight=7) as sink:
        assert sink.deliver(batch) == [None] * 120
    assert counting.peak == 7, counting.peak
    assert sorted(counting.acked_keys()) == sorted(keys(batch))


def test_a_group_never_has_two_requests_out_at_once(counting: Counting) -> None:
    out: dict[str, int] = {}
    overlap: list[str] = []
    lock = threading.Lock()

    def one_per_group(headers: dict[str, str], body: bytes) -> tuple[int, bytes, float]:
        ids = [m["record"]["id"] for m in json.loads(body)["data"]]
        groups = {f"g{i % 10}" for i in ids}
        with lock:
            overlap.extend(g for g in groups if out.get(g))
            for g in groups:
                out[g] = out.get(g, 0) + 1
        try:
            return counting.hold(200, b"{}", 0.02)
        finally:
            with lock:
                for g in groups:
                    out[g] -= 1

    counting.behaviour = one_per_group
    batch = messages(200, groups=10)
    with webhook(counting.url, batch_size=3, max_in_flight=50) as sink:
        assert deliver_in_order(sink, batch) == [None] * 200
    assert overlap == []
    assert counting.peak >= 2  # chunks of different groups did go together
    acked_in_order(counting, batch)


def test_an_outage_in_the_middle_of_a_full_window_reports_only_what_was_acknowledged(counting: Counting) -> None:
    answered = {"n": 0}
    lock = threading.Lock()

    def down_after_50(headers: dict[str, str], body: bytes) -> tuple[int, bytes, float]:
        with lock:
            answered["n"] += 1
            status = 200 if answered["n"] <= 50 else 503
        return counting.hold(status, b"down" if status == 503 else b"{}", fill=100)

    counting.behaviour = down_after_50
    batch = messages(400, groups=200)
    with webhook(counting.url, batch_size=1, max_in_flight=100, timeout_ms=120000) as sink:
        results = sink.deliver(batch)
    delivered = {k for k, r in zip(keys(batch), results, strict=True) if r is None}
    # Delivered means acknowledged (at least once); everything else says why; nothing past the outage is sent.
    assert delivered == set(counting.acked_keys())
    assert len(delivered) == 50
    # why: the 503, or not sent behind its group's earlier message that was not acknowledged (NOT_SENT: held)
    assert all(r is NOT_SENT or "HTTP 503" in r for r in results if r is not None)
    assert len(counting.requests) < 400  # the window stopped once the endpoint answered 503
    acked_in_order(counting, batch)


def test_an_endpoint_closing_idle_connections_and_answering_chunked_loses_nothing() -> None:
    """The webhook's own HTTP/1.1 client (sinks/http1.py) against a raw server that answers keep-alive
    style (chunked, no `Connection: close`) and then closes every connection: a reused connection found
    closed is replaced, never a message failed; a chunked error body is read."""
    from cdc_pipeline_tests.security.test_webhook_hostile import RawServer

    holder: dict[str, RawServer] = {}
    status = {"code": b"200 OK"}

    def chunked_then_close(conn: object, head: bytes) -> None:
        body = b'{"error":"nope"}' if status["code"] != b"200 OK" else b"{}"
        holder["s"].send(conn, b"HTTP/1.1 " + status["code"] + b"\r\nTransfer-Encoding: chunked\r\n\r\n"  # type: ignore[arg-type]
                         + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))

    s = holder["s"] = RawServer(chunked_then_close)
    try:
        with webhook(f"http://127.0.0.1:{s.port}/h", batch_size=1, max_in_flight=4) as sink:
            for start in range(0, 12, 4):  # later calls find the last call's connections closed
                assert sink.deliver(messages(4, groups=0, start=start)) == [None] * 4
            status["code"] = b"422 Unprocessable"
            assert sink.deliver(messages(1, groups=0)) == ['HTTP 422: {"error":"nope"}']
    finally:
        s.stop()
