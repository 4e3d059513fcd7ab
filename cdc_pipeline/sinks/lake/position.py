"""A lake sink's own record of how far each table holds the log, committed atomically with the table's data
(Delta: transaction identifiers, `txn` app id and version; Iceberg: snapshot summary properties), one per
key (the sink's name, or a lane's: core/lanes.py).

Two marks per key: `position`, where a restart may resume (below any message the engine parks in that
batch: the context's `ceiling`), and `applied`, the batch's last message written. Messages up to `position` are
in the table; an append table may also hold some between the two (checked by idempotency key on redelivery).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cdc_pipeline.core.positions import Position

NONE: Position = (0, -1)
SUMMARY_PREFIX = "cdc-pipeline"


@dataclass(frozen=True)
class Marks:
    position: Position
    applied: Position

    @staticmethod
    def of(last: Position, ceiling: Position | None) -> Marks:
        """The marks of a batch ending at `last`, none at or past the engine's `ceiling`."""
        held = min(last, (ceiling[0], ceiling[1] - 1)) if ceiling is not None else last
        return Marks(held, last)


# -- Delta: four app transactions (a version is one int64: a position is two) ---------------------------
def delta_app_ids(key: str) -> dict[str, str]:
    return {f"{mark}.{part}": f"cdc_pipeline:{key}:{mark}.{part}"
            for mark in ("position", "applied") for part in ("lsn", "idx")}


def delta_versions(marks: Marks) -> dict[str, int]:
    return {"position.lsn": marks.position[0], "position.idx": marks.position[1],
            "applied.lsn": marks.applied[0], "applied.idx": marks.applied[1]}


def delta_read(key: str, version_of: Callable[[str], int | None]) -> Marks | None:
    got = {name: version_of(app) for name, app in delta_app_ids(key).items()}
    if any(v is None for v in got.values()):
        return None
    return Marks((int(got["position.lsn"] or 0), int(got["position.idx"] or 0)),
                 (int(got["applied.lsn"] or 0), int(got["applied.idx"] or 0)))


# -- Iceberg: snapshot summary properties -------------------------------------------------------------
def iceberg_properties(key: str, marks: Marks) -> dict[str, str]:
    return {f"{SUMMARY_PREFIX}.position.{key}": f"{marks.position[0]}:{marks.position[1]}",
            f"{SUMMARY_PREFIX}.applied.{key}": f"{marks.applied[0]}:{marks.applied[1]}"}


def iceberg_read(key: str, summary: Mapping[str, str]) -> Marks | None:
    position = summary.get(f"{SUMMARY_PREFIX}.position.{key}")
    applied = summary.get(f"{SUMMARY_PREFIX}.applied.{key}")
    if position is None or applied is None:
        return None
    return Marks(_parse(position), _parse(applied))


def _parse(text: str) -> Position:
    lsn, _, idx = text.partition(":")
    return int(lsn), int(idx)
