"""The lane split (core/lanes.py), attacked with hypothesis: however the number of lanes changes while
lanes are at any progress, every message is settled exactly once and no group goes backwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_pipeline.core.lanes import CRC32, MAX_LANES, MD5, Split, lane_of, parking_group, resplit
from cdc_pipeline.core.positions import START, Position


def test_lane_of_is_stable_and_spreads() -> None:
    assert lane_of("public|orders|1", 1) == 0
    # Literal values: a change of hash (Python's salted hash(), another function) would move groups between
    # the lanes of a running pipeline, splitting a group across two lanes.
    assert [lane_of(f"public|t|{i}", 4) for i in range(8)] == [2, 0, 2, 0, 3, 1, 3, 1]
    assert [lane_of(f"public|orders|[{i}]", 3) for i in range(6)] == [0, 2, 2, 2, 1, 1]
    assert lane_of("ümlaut|é", 7) == 4
    counts = [0] * 4
    for i in range(4000):
        counts[lane_of(parking_group(f"public|t|{i}", (i, 0)), 4)] += 1
    assert min(counts) > 800
    assert parking_group(None, (5, 1)) == "~5:1" and parking_group("g", (5, 1)) == "g"


def test_the_md5_lane_hash_is_stable_and_spreads() -> None:
    """The hash the state database computes too (state/change_log.py): literal values, as for CRC-32."""
    assert [lane_of(f"public|t|{i}", 4, MD5) for i in range(8)] == [3, 0, 1, 2, 0, 1, 2, 1]
    counts = [0] * 4
    for i in range(4000):
        counts[lane_of(parking_group(f"public|t|[{i}]", (i, 0)), 4, MD5)] += 1
    assert min(counts) > 800
    assert Split(3, hashing=MD5).lane_of("ümlaut|é") == lane_of("ümlaut|é", 3, MD5)


def test_a_split_of_an_older_version_keeps_crc32_in_its_layers() -> None:
    old = Split(2)  # as state/lanes.py reads a split made before MD5: CRC-32
    new, start = resplit(old, [(10, 0), (20, 0)], 2)
    assert new.hashing == MD5 and new.prior_hashing == (CRC32,) and start == (10, 0)
    group = next(g for g in (f"public|t|{i}" for i in range(100)) if lane_of(g, 2) != lane_of(g, 2, MD5))
    settled_by = [(10, 0), (20, 0)][lane_of(group, 2)]  # its old lane's offset, by CRC-32
    assert new.settled_before(group, settled_by) and not new.settled_before(group, (settled_by[0] + 1, 0))
    again, _ = resplit(new, [(20, 0), (20, 0)], 3)
    assert again.prior_hashing == () and again.prior == ()  # both lanes past every layer: none kept


@pytest.mark.parametrize("seed", ["0", "1", "12345"])
def test_lanes_are_the_same_in_another_process_with_another_hash_seed(seed: str) -> None:
    """Each lane is its own process: a group must hash to the same lane in every one of them."""
    here = [lane_of(f"public|t|{i}", 5) for i in range(50)]
    code = "from cdc_pipeline.core.lanes import lane_of; print([lane_of(f'public|t|{i}', 5) for i in range(50)])"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout
    assert json.loads(there) == here


def test_resplit_rejects_offsets_of_another_split() -> None:
    try:
        resplit(Split(2), [START], 3)
    except ValueError as e:
        assert "2 lanes" in str(e)
    else:
        raise AssertionError("accepted one offset for two lanes")


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[tuple[Position, str]], list[tuple[str, int, int]]]:
    groups = draw(st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=6, unique=True))
    n = draw(st.integers(1, 60))
    log = [((i // 3, i % 3), draw(st.sampled_from(groups))) for i in range(n)]
    # A split's lane hash too: a split of an older version's CRC-32 is re-split to MD5 (same N or not).
    steps = draw(st.lists(st.one_of(st.tuples(st.just("advance"), st.integers(0, MAX_LANES - 1), st.just(0)),
                                    st.tuples(st.just("resplit"), st.integers(1, 5), st.sampled_from([CRC32, MD5]))),
                          max_size=30))
    return log, steps


@settings(max_examples=400, deadline=None)
@given(histories(), st.integers(1, 8))
def test_any_history_of_splits_settles_every_message_once_in_group_order(
        history: tuple[list[tuple[Position, str]], list[tuple[str, int, int]]], step: int) -> None:
    log, steps = history
    split = Split()
    offsets = [START]
    sent: list[tuple[Position, str]] = []

    def advance(lane: int, upto: int) -> None:
        """Lane ``lane`` settles up to ``upto`` more of the log's messages after its offset."""
        done = 0
        for pos, group in log:
            if pos <= offsets[lane] or done >= upto:
                continue
            done += 1
            if split.lane_of(group) == lane and not split.settled_before(group, pos):
                sent.append((pos, group))
            offsets[lane] = pos

    for what, arg, hashing in steps:
        if what == "advance":
            advance(arg % split.lanes, step)
        else:
            split, start = resplit(split, offsets, arg, hashing)
            offsets = [start] * arg
    for lane in range(split.lanes):
        advance(lane, len(log))
    assert sorted(sent) == sorted(log), "a message was lost or sent twice"
    for group in {g for _, g in log}:
        mine = [pos for pos, g in sent if g == group]
        assert mine == sorted(mine), f"group {group!r} went backwards: {mine}"
