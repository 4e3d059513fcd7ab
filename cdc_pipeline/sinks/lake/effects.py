"""A mirror's batch of one table reduced to what it does to the table: one effect per primary key, and
whether the table is emptied first. Pure (hypothesis-tested against applying the changes one by one).

Per key the last effect wins: a delete, or the row's values. An update carrying only some columns (the
unchanged TOAST values are left out) lays its values over the key's earlier row of the batch; with none in the
batch, the effect is `partial` and the table's row supplies the columns left out. An update that changes
the key deletes the old key. A TRUNCATE drops every effect before it: the table is emptied, then what
follows is applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

Key = tuple[Any, ...]


@dataclass(frozen=True)
class Change:
    action: str  # insert, update, delete, read, truncate
    record: dict[str, Any] | None
    changes: dict[str, Any] | None = None  # old values of the columns an update changed (the old key among them)
    texts: dict[str, str] | None = None  # exact texts of values whose JSON is not exact (change_log.texts)


@dataclass
class Effect:
    delete: bool
    row: dict[str, Any] = field(default_factory=dict)  # the values (record columns) to write
    texts: dict[str, str] = field(default_factory=dict)
    partial: bool = False  # some columns were left out and no full row of the key precedes in the batch
    base: Key | None = None  # partial: the key whose row in the table supplies them (the old one after a key change)


@dataclass
class TableEffects:
    truncate: bool = False
    by_key: dict[Key, Effect] = field(default_factory=dict)  # in order of each key's last change


def key_of(record: dict[str, Any], pk: Sequence[str]) -> Key:
    return tuple(_hashable(record.get(k)) for k in pk)


def _hashable(v: Any) -> Any:
    v = getattr(v, "value", v)  # a values.Typed key: its value
    return tuple(_hashable(x) for x in v) if isinstance(v, list) else v


def reduce(changes: Iterable[Change], pk: Sequence[str], columns: Sequence[str]) -> TableEffects:
    out = TableEffects()
    for c in changes:
        if c.action == "truncate":
            out = TableEffects(truncate=True)
            continue
        record = c.record or {}
        key = key_of(record, pk)
        if c.action == "delete":
            _put(out, key, Effect(delete=True))
            continue
        old = key_of({**record, **c.changes}, pk) if c.action == "update" and c.changes else key
        before = out.by_key.get(old)
        if old != key:  # the key changed: the old one is deleted, its row goes on under the new key
            _put(out, old, Effect(delete=True))
        texts = dict(c.texts or {})
        full = c.action != "update" or all(col in record for col in columns)
        if full or before is None or before.delete:
            # A partial row with a delete before it in the batch cannot happen (a new row is inserted whole).
            _put(out, key, Effect(False, dict(record), texts, partial=not full, base=None if full else old))
        else:
            merged_texts = {k: v for k, v in before.texts.items() if k not in record}
            _put(out, key, Effect(False, {**before.row, **record}, {**merged_texts, **texts}, before.partial,
                                  before.base))
    return out


def _put(out: TableEffects, key: Key, effect: Effect) -> None:
    out.by_key.pop(key, None)  # re-inserted: the dict keeps each key's last change's order
    out.by_key[key] = effect
