"""The engine's per-group order (delivery/schedule/order.py): what each sink call carries, what is held back."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_pipeline.delivery.schedule.order import HELD, GroupOrder, SinkContractError, split_held
from cdc_pipeline.sinks.base import NOT_SENT, OutboundMessage

# A batch: each message's group (None = ungrouped) and whether the destination accepts it.
batches = st.lists(st.tuples(st.sampled_from([None, "a", "b", "c", "d"]), st.booleans()), max_size=40)


def run(batch: Sequence[tuple[str | None, bool]], one_per_group: bool, stops: bool,
        ) -> tuple[list[str | None], list[list[int]], list[int]]:
    """Drive GroupOrder as schedule/dispatch.py does against a destination model. `stops`: the sink stops at its
    first failure (the rest NOT_SENT); else it carries on, as a pipelined sink does. Returns the outcome,
    the calls and the indexes sent, in sending order."""
    order = GroupOrder([g for g, _ in batch], one_per_group)
    calls: list[list[int]] = []
    sent: list[int] = []
    while call := order.next_call():
        calls.append(call)
        results: list[str | None] = []
        for i in call:
            if stops and any(r is not None for r in results):
                results.append(NOT_SENT)
                continue
            sent.append(i)
            results.append(None if batch[i][1] else f"rejected {i}")
        order.record(call, results)
    return order.outcome(), calls, sent


@settings(max_examples=400)
@given(batch=batches, one_per_group=st.booleans(), stops=st.booleans())
def test_each_group_delivers_up_to_its_first_failure_and_holds_the_rest(batch: list[tuple[str | None, bool]],
                                                                        one_per_group: bool, stops: bool) -> None:
    outcome, _, _ = run(batch, one_per_group, stops)
    failed: set[str] = set()
    for i, ((group, ok), result) in enumerate(zip(batch, outcome, strict=True)):
        if group is not None and group in failed:
            assert result == HELD  # whatever the sink did with it
        elif ok:
            assert result is None
        else:
            assert result == f"rejected {i}"
            if group is not None:
                failed.add(group)


@settings(max_examples=400)
@given(batch=batches, one_per_group=st.booleans())
def test_a_sink_that_stops_never_sends_a_group_past_its_failure(batch: list[tuple[str | None, bool]],
                                                                 one_per_group: bool) -> None:
    _, _, sent = run(batch, one_per_group, stops=True)
    assert len(sent) == len(set(sent))  # nothing is sent twice
    failed: set[str] = set()
    for i in sent:
        group, ok = batch[i]
        assert group is None or group not in failed
        if not ok and group is not None:
            failed.add(group)
    # Every message of a group that has not failed is sent, in batch order within its group.
    for g in {g for g, _ in batch if g is not None}:
        mine = [i for i in sent if batch[i][0] == g]
        assert mine == sorted(mine)


@settings(max_examples=400)
@given(batch=batches)
def test_rounds_send_a_groups_next_message_only_after_the_previous_was_acknowledged(
        batch: list[tuple[str | None, bool]]) -> None:
    outcome, calls, _ = run(batch, one_per_group=True, stops=False)
    settled_before: set[int] = set()
    for call in calls:
        groups = [batch[i][0] for i in call if batch[i][0] is not None]
        assert len(groups) == len(set(groups))  # at most one message per group per call
        for i in call:
            group = batch[i][0]
            earlier = [j for j in range(i) if group is not None and batch[j][0] == group]
            assert all(j in settled_before and outcome[j] is None for j in earlier)
        settled_before.update(call)


def test_ungrouped_messages_go_in_one_call_even_in_rounds() -> None:
    order = GroupOrder([None, "a", None, "a", None], one_per_group=True)
    assert order.next_call() == [0, 1, 2, 4]
    order.record([0, 1, 2, 4], [None, None, "boom", None])
    assert order.next_call() == [3]
    order.record([3], [None])
    assert order.next_call() == []
    assert order.outcome() == [None, None, "boom", None, None]


def test_give_up_fails_each_groups_first_unsettled_message_and_holds_the_rest() -> None:
    order = GroupOrder(["a", "b", "a", None, "b"], one_per_group=True)
    first = order.next_call()
    order.record(first, [None, None, None])  # 0 (a), 1 (b), 3 (ungrouped)
    second = order.next_call()
    assert second == [2, 4]
    order.give_up(second, "not delivered: gone")
    assert order.outcome() == [None, None, "not delivered: gone", None, "not delivered: gone"]
    assert order.delivered == 3 and sorted(order.parked) == [2, 4]


def test_results_that_break_the_contract_are_refused() -> None:
    order = GroupOrder(["a", "a"])
    call = order.next_call()
    with pytest.raises(SinkContractError, match="1 results for 2"):
        order.record(call, [None])
    with pytest.raises(SinkContractError, match="attempted none"):
        order.record(call, [NOT_SENT, NOT_SENT])
    with pytest.raises(SinkContractError, match="sent after an earlier message of its group"):
        order.record(call, [NOT_SENT, None])
    with pytest.raises(SinkContractError, match="not settled"):
        order.outcome()


def test_split_held_keeps_back_groups_with_a_parked_message_or_an_earlier_stage_failure() -> None:
    batch = [OutboundMessage(f"10:{i}", g, None, b"{}") for i, g in enumerate(["a", "b", "c", "b", None, "c"])]
    send, held = split_held(batch, {"a"}, [((10, 2), "b"), ((10, 9), "c"), ((10, 1), None)])
    assert [m.key for m in held] == ["10:0", "10:3"]  # a is parked; b failed at 10:2, before 10:3
    assert [m.key for m in send] == ["10:1", "10:2", "10:4", "10:5"]  # c failed only after them
