"""Lanes: one sink's messages split over `lanes: N` deliverers by a stable hash of their ordering group, each
lane with its own offset, parked messages and locks, so one sink can use several processes (or Dagster
runs, or pods). A group lives in exactly one lane, so per-group order holds as it does with one.

Changing N (the split) is safe without stopping the world at one position: when the split changes, the
old lanes' offsets are recorded (``prior``) and every new lane starts at the lowest of them, skipping each
message an old lane had already settled (delivered, filtered or parked: its position is at or below the
offset of the old lane its group hashed to). Parked messages move to the new lane of their group. So
nothing is lost (every message is past exactly one old offset or at none) and nothing goes backwards
(a group's messages after its old lane's offset are sent by its one new lane, in order).

A split names its lane hash: CRC-32 (``CRC32``, the first, which only Python computes) or the first four bytes
of MD5 (``MD5``, which the state database computes as well: a lane then reads only its share of the log,
state/change_log.py). New splits use MD5; a split made by an older version keeps CRC-32 until a lane of this
version re-splits it (same N, new hash) like any change of N, so each layer of ``prior`` keeps its own hash.

Pure: no I/O; the state database side is state/lanes.py, a deliverer's side delivery/lane_keeper.py.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from cdc_pipeline.core.positions import Position, position_text

MAX_LANES = 64
CRC32, MD5 = 1, 2  # lane hashes (the module docstring)
LANE_HASH = MD5  # what a new split uses


def lane_name(sink: str, lane: int, lanes: int) -> str:
    """What names a lane in locks and logs: the sink's name when it has one lane, as before lanes existed."""
    return sink if lanes == 1 else f"{sink}#{lane}/{lanes}"


def position_key(sink: str, lane: int, lanes: int, generation: int) -> str:
    """The key a destination records a lane's own position under (a Postgres mirror commits it with the
    rows): new with every change of split, so a lane never resumes from another split's record."""
    return sink if lanes == 1 and generation == 0 else f"{sink}@{generation}#{lane}/{lanes}"


def parking_group(group: str | None, position: Position) -> str:
    """The group a message is parked and laned under: an ungrouped message is its own group."""
    return group if group is not None else f"~{position_text(position)}"


def lane_of(group: str, lanes: int, hashing: int = CRC32) -> int:
    """The lane of a parking group: stable across processes, versions and restarts (not hash()). MD5's first four
    bytes, big-endian, are what state/change_log.py computes in SQL."""
    if lanes <= 1:
        return 0
    data = group.encode("utf-8", "surrogatepass")
    if hashing == CRC32:
        return zlib.crc32(data) % lanes
    return int.from_bytes(hashlib.md5(data).digest()[:4], "big") % lanes


@dataclass(frozen=True)
class Split:
    """How a sink's messages are split now: ``lanes``, and the offsets earlier splits' lanes had reached when
    they changed (``prior``: one layer per earlier split still relevant, each one offset per old lane)."""

    lanes: int = 1
    prior: tuple[tuple[Position, ...], ...] = ()
    hashing: int = CRC32
    prior_hashing: tuple[int, ...] = ()  # each layer's hash; a layer without one (older versions') CRC-32

    def lane_of(self, group: str) -> int:
        return lane_of(group, self.lanes, self.hashing)

    def layer_hashing(self, i: int) -> int:
        return self.prior_hashing[i] if i < len(self.prior_hashing) else CRC32

    def settled_before(self, group: str, position: Position) -> bool:
        """Whether an earlier split already settled this message (delivered, filtered or parked it): its lane
        in this split skips it."""
        return any(position <= layer[lane_of(group, len(layer), self.layer_hashing(i))]
                   for i, layer in enumerate(self.prior))


def resplit(old: Split, old_offsets: Sequence[Position], lanes: int, hashing: int = LANE_HASH
            ) -> tuple[Split, Position]:
    """The split after changing ``old`` (whose lanes stand at ``old_offsets``) to ``lanes`` lanes, and where
    every new lane starts: the lowest old offset. An old lane at its offset has settled its messages up to
    it, itself or by skipping what an earlier split settled; past it, only the earlier layers know, so they
    are kept while they reach past the start."""
    if len(old_offsets) != old.lanes:
        raise ValueError(f"{len(old_offsets)} offsets for a split of {old.lanes} lanes")
    if not 1 <= lanes <= MAX_LANES:
        raise ValueError(f"lanes must be 1 to {MAX_LANES}, not {lanes}")
    start = min(old_offsets)
    layers = (tuple(old_offsets), *old.prior)
    hashes = (old.hashing, *(old.layer_hashing(i) for i in range(len(old.prior))))
    kept = [i for i, layer in enumerate(layers) if max(layer) > start]
    return Split(lanes, tuple(layers[i] for i in kept), hashing, tuple(hashes[i] for i in kept)), start
