"""The pure plan of batch requests (sinks/batch_plan.py): every message in one request or refused, limits
kept, call order kept, a too-large message (or one refused while encoding) refused alone. (A call holds at
most one message per group: the scheduler's, tested in test_call_window.py.)"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_pipeline.sinks.aws.names import FIFO_ID_CHARS, dedup_id, fifo_group_id, partition_key, route_problem
from cdc_pipeline.sinks.batch_plan import RequestLimits, bounded_id, plan_requests

LIMITS = RequestLimits(max_entries=4, max_request_bytes=100, max_entry_bytes=60, what="test entry")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 70), max_size=60))
def test_plan_keeps_limits_and_order(sizes: list[int]) -> None:
    plan = plan_requests(sizes, LIMITS)
    placed = [i for r in plan.requests for i in r]
    assert sorted(placed + list(plan.refused)) == list(range(len(sizes)))  # each once
    assert all(r for r in plan.requests)
    for request in plan.requests:
        assert len(request) <= LIMITS.max_entries and sum(sizes[i] for i in request) <= LIMITS.max_request_bytes
        assert request == sorted(request)
    for i, size in enumerate(sizes):
        if size > LIMITS.max_entry_bytes:
            assert "too large" in plan.refused[i] and f"{size} bytes" in plan.refused[i] and "60" in plan.refused[i]
        else:
            assert i in placed


def test_a_message_refused_while_encoding_fails_alone() -> None:
    plan = plan_requests(["bad route", 5, 5, 5], LIMITS)
    assert plan.refused == {0: "bad route"}
    assert plan.requests == [[1, 2, 3]]


def test_requests_fill_in_order() -> None:
    assert plan_requests([10] * 9, LIMITS).requests == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]


@given(st.text(max_size=300))
def test_ids_are_stable_and_legal(value: str) -> None:
    gid = fifo_group_id(value, "1:2")
    assert gid == fifo_group_id(value, "9:9") and 0 < len(gid) <= 128 and set(gid) <= FIFO_ID_CHARS
    assert gid == value or len(gid) == 64
    assert 0 < len(partition_key(value, "1:2")) <= 256
    assert fifo_group_id(None, "1:2") == "1:2" == dedup_id("1:2") == partition_key(None, "1:2")
    assert bounded_id(value, 10) == bounded_id(value, 10)


def test_route_names() -> None:
    assert route_problem("queue", None, ["x"]) is None
    assert route_problem("queue", "orders.fifo", None) is None
    assert "invalid queue name" in str(route_problem("queue", "a b", None))
    assert "route_prefixes" in str(route_problem("topic", "other", ["cdc-"]))
    assert "invalid stream name" in str(route_problem("stream", "x" * 129, None))
