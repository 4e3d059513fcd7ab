"""One record per group in flight (sinks/kafka/flight.py), against a model: whatever order the reports come
back in, a group never has two messages out, its messages go out in batch order, nothing of a group goes
out after one of its messages failed, and every message of a group with no failure goes out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_pipeline.sinks.kafka.flight import GroupFlight


@settings(max_examples=400, deadline=None)
@given(groups=st.lists(st.sampled_from(["a", "b", "c", None]), max_size=30), data=st.data())
def test_the_flight_keeps_each_group_in_order_and_stops_it_at_a_failure(groups, data) -> None:  # type: ignore[no-untyped-def]
    flight = GroupFlight(groups)
    out: list[int] = []  # produced, awaiting their report
    produced: list[int] = []
    failed_groups: set[str] = set()
    not_sent: set[int] = set()
    while True:
        for i in flight.take():
            assert i not in produced
            g = groups[i]
            assert g is None or all(groups[j] != g for j in out), "two of a group in flight"
            assert g not in failed_groups
            produced.append(i)
            out.append(i)
        if not out:
            break
        i = out.pop(data.draw(st.integers(0, len(out) - 1)))
        if data.draw(st.booleans()) or groups[i] is None:
            flight.stored(i)
        else:
            rest = flight.failed(i)
            assert rest == [j for j in range(i + 1, len(groups)) if groups[j] == groups[i]]
            failed_groups.add(groups[i])
            not_sent.update(rest)
    for g in set(groups):
        mine = [i for i in produced if groups[i] == g]
        assert mine == sorted(mine)
    assert sorted(produced + sorted(not_sent)) == list(range(len(groups)))
    assert flight.stop() == []
