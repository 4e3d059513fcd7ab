"""The rows a lake sink writes, as Arrow: a mirror's effects (effects.py) and an append table's messages,
their values converted to each column's type (values.py). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cdc_pipeline.sinks.lake import values
from cdc_pipeline.sinks.lake.effects import Change, Effect, Key, TableEffects

KIND = "_cdc_kind"  # a mirror batch's column: 'delete' or 'upsert' (never written to the table)
# An append table's columns after the record's: what the message says about the change.
HISTORY_FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("action", pa.string()), ("commit_lsn", pa.int64()), ("commit_idx", pa.int32()),
    ("commit_timestamp", pa.timestamp("us", "UTC")), ("commit_date", pa.date32()),
    ("idempotency_key", pa.string()), ("changes", pa.string()),
)

HISTORY_NAMES = frozenset(name for name, _ in HISTORY_FIELDS)


@dataclass(frozen=True)
class Shape:
    """A source table as a lake table sees it: its columns' Arrow types and its primary key."""

    source: str  # schema.table
    fields: tuple[tuple[str, pa.DataType], ...]
    primary_key: tuple[str, ...]

    @property
    def columns(self) -> list[str]:
        return [name for name, _ in self.fields]

    def schema(self, append: bool) -> pa.Schema:
        return pa.schema([*self.fields, *(HISTORY_FIELDS if append else ())])


@dataclass
class Parsed:
    """One message as the sink reads it."""

    position: tuple[int, int]
    source: str
    change: Change
    commit_timestamp: str | None
    raw_changes: Any = None  # the update's old values as the message gives them (an append table's `changes`)


def parse(payload: bytes) -> Parsed:
    body = values.loads(payload)
    meta = body.get("metadata") or {}
    action = body.get("action") or ("delete" if body.get("deleted") else "read")  # a row stream has no action
    change = Change(action, body.get("record"), body.get("changes"), body.get("texts"))
    position = (int(meta["commit_lsn"]), int(meta["commit_idx"]))
    return Parsed(position, f"{meta['table_schema']}.{meta['table_name']}", change, meta.get("commit_timestamp"),
                  change.changes)


def typed_change(shape: Shape, change: Change, python_calendar: bool = False) -> Change | str:
    """The change with its record's (and old key's) values converted once to their columns' types (as
    `values.Typed`), or why it cannot be written (the column named). `python_calendar`: dates and timestamps must
    lie in years 1 to 9999 (pyiceberg turns a file's statistics into Python dates)."""
    record, texts = change.record or {}, change.texts or {}
    converted: dict[str, Any] = {}
    kinds = dict(shape.fields)
    for name, kind in shape.fields:
        if name not in record and name not in texts:
            continue  # left out (an unchanged TOAST value, a delete's other columns): stays out
        try:
            value = values.convert(record.get(name), texts.get(name), kind)
            if python_calendar:
                values.check_calendar(value, kind)
        except (values.Unrepresentable, ValueError, ArithmeticError) as exc:
            return f"column {name!r} of {shape.source}: {exc} cannot be written as {kind} exactly"
        converted[name] = values.Typed(value)
    old = None
    if change.changes is not None:
        try:
            old = {k: values.Typed(values.convert(v, None, kinds[k])) if k in kinds else v
                   for k, v in change.changes.items()}
        except (values.Unrepresentable, ValueError, ArithmeticError):
            old = change.changes
    return Change(change.action, converted if change.record is not None else None, old, None)


def _column(shape_fields: Sequence[tuple[str, pa.DataType]], rows: Sequence[dict[str, Any]],
            texts: Sequence[dict[str, str]]) -> dict[str, pa.Array]:
    return {name: pa.array([values.convert(r.get(name), t.get(name), kind) for r, t in zip(rows, texts, strict=True)],
                           kind) for name, kind in shape_fields}


def mirror_table(shape: Shape, effects: TableEffects, current: Callable[[list[Key]], dict[Key, dict[str, Any]]]
                 ) -> pa.Table:
    """One row per key: its values (an upsert) or its key (a delete), with the `_cdc_kind` column. `current`
    gives the table's rows of keys whose effect is partial (their columns left out are kept)."""
    # Keys hold converted values (typed_change), as the table's rows do.
    wanted = [e.base for e in effects.by_key.values() if e.partial and e.base is not None and not effects.truncate]
    base = current(wanted) if wanted else {}
    rows, texts, kinds = [], [], []
    for key, effect in effects.by_key.items():
        kinds.append("delete" if effect.delete else "upsert")
        if effect.delete:
            rows.append({k: values.Typed(v) for k, v in zip(shape.primary_key, key, strict=True)})
            texts.append({})
        else:
            row, text = _filled(effect, base.get(effect.base) if effect.base is not None else None)
            rows.append(row)
            texts.append(text)
    columns = _column(shape.fields, rows, texts)
    columns[KIND] = pa.array(kinds, pa.string())
    return pa.table(columns)


def _filled(effect: Effect, current: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, str]]:
    if not effect.partial or current is None:
        return effect.row, effect.texts
    # The table's values are already of the column's type.
    missing = {k: values.Typed(v) for k, v in current.items() if k not in effect.row}
    return {**effect.row, **missing}, effect.texts


def append_table(shape: Shape, messages: Sequence[Parsed]) -> pa.Table:
    """One row per message: the record's columns, then HISTORY_FIELDS."""
    rows = [m.change.record or {} for m in messages]
    texts = [m.change.texts or {} for m in messages]
    columns = _column(shape.fields, rows, texts)
    stamps = [values._micros(m.commit_timestamp.rstrip("Z") + "+00:00") if m.commit_timestamp else None
              for m in messages]
    columns.update({
        "action": pa.array([m.change.action for m in messages], pa.string()),
        "commit_lsn": pa.array([m.position[0] for m in messages], pa.int64()),
        "commit_idx": pa.array([m.position[1] for m in messages], pa.int32()),
        "commit_timestamp": pa.array(stamps, pa.timestamp("us", "UTC")),
        "commit_date": pa.array([s // 86_400_000_000 if s is not None else None for s in stamps], pa.date32()),
        "idempotency_key": pa.array([f"{m.position[0]}:{m.position[1]}" for m in messages], pa.string()),
        "changes": pa.array([values.dump(m.raw_changes) if m.raw_changes is not None else None
                             for m in messages], pa.string()),
    })
    return pa.table(columns, schema=shape.schema(append=True))
