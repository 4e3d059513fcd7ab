"""The pure schema history (capture/schema_history.py): a random sequence of DDL statements (each one or more
sub-commands: adds with and without defaults, drops, renames including swaps, type changes) and row changes,
replayed on a model mirror through ``diff`` of the shapes the event trigger reports, gives the source's table."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_pipeline.capture.schema_history import (
    Column,
    Op,
    Shape,
    ShapeError,
    apply_to_columns,
    apply_to_rows,
    diff,
    parse_shape,
    reread_needed,
)

NAMES = ["a", "b", "c", "d"]


class Source:
    """A table as PostgreSQL keeps it: columns by attnum (never reused), rows by id."""

    def __init__(self) -> None:
        self.columns: list[Column] = [Column(1, "id", "integer")]
        self.next = 2
        self.rows: dict[int, dict[str, Any]] = {}

    def shape(self) -> Shape:
        return Shape("public.t", tuple(self.columns))

    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def ddl(self, kind: str, pick: int, name: str, default: int | None) -> None:
        others = [c for c in self.columns if c.name != "id"]
        if kind == "add" and name not in self.names():
            self.columns.append(Column(self.next, name, "integer", default=None if default is None else str(default),
                                       missing=None if default is None else str(default)))
            self.next += 1
            for r in self.rows.values():
                r[name] = default
        elif kind == "drop" and others:
            gone = others[pick % len(others)]
            self.columns.remove(gone)
            for r in self.rows.values():
                del r[gone.name]
        elif kind == "rename" and others and name not in self.names():
            old = others[pick % len(others)]
            self.columns[self.columns.index(old)] = replace(old, name=name)
            for r in self.rows.values():
                r[name] = r.pop(old.name)
        elif kind == "type" and others:
            c = others[pick % len(others)]
            self.columns[self.columns.index(c)] = replace(c, type="bigint" if c.type == "integer" else "integer")

    def swap(self) -> None:
        """RENAME a TO tmp, b TO a, tmp TO b in one statement: a cycle for the diff."""
        others = [c for c in self.columns if c.name != "id"]
        if len(others) >= 2:
            x, y = others[0], others[1]
            self.columns[self.columns.index(x)] = replace(x, name=y.name)
            self.columns[self.columns.index(y)] = replace(y, name=x.name)
            for r in self.rows.values():
                r[x.name], r[y.name] = r[y.name], r[x.name]


ddl_step = st.tuples(st.sampled_from(["add", "drop", "rename", "type", "swap"]), st.integers(0, 5),
                     st.sampled_from(NAMES), st.one_of(st.none(), st.integers(-5, 5)))
dml_step = st.tuples(st.sampled_from(["insert", "update", "delete"]), st.integers(1, 6), st.integers(-99, 99))
steps = st.lists(st.one_of(st.tuples(st.just("ddl"), st.lists(ddl_step, min_size=1, max_size=3)),
                           st.tuples(st.just("dml"), dml_step)), max_size=40)


def _dml(src: Source, mirror: dict[int, dict[str, Any]], kind: str, key: int, value: int) -> None:
    if kind == "delete":
        src.rows.pop(key, None)
        mirror.pop(key, None)
        return
    if kind == "insert" and key in src.rows or kind == "update" and key not in src.rows:
        return
    row = {c.name: value for c in src.columns} | {"id": key}
    src.rows[key] = row
    mirror[key] = dict(row)  # the change's record: the row with the columns at its commit


@settings(max_examples=300, deadline=None)
@given(steps)
def test_replayed_history_gives_the_source_table(script: list[tuple[str, Any]]) -> None:
    src = Source()
    mirror: dict[int, dict[str, Any]] = {}
    mirror_columns = src.names()
    for kind, body in script:
        if kind == "dml":
            _dml(src, mirror, *body)
            continue
        before = src.shape()
        for sub, pick, name, default in body:
            src.swap() if sub == "swap" else src.ddl(sub, pick, name, default)
        ops = diff(before, src.shape())
        rows = apply_to_rows(list(mirror.values()), ops, parse=int)
        mirror = {r["id"]: r for r in rows}
        mirror_columns = apply_to_columns(mirror_columns, ops)
        assert not reread_needed(ops)  # constant defaults, no USING: the stream alone is enough
    assert sorted(mirror_columns) == sorted(src.names())
    assert mirror == src.rows


def test_a_volatile_default_or_using_needs_a_reread() -> None:
    before = Shape("public.t", (Column(1, "id", "integer"), Column(2, "n", "integer")))
    volatile = Shape("public.t", (*before.columns, Column(3, "r", "double precision", default="random()")))
    assert reread_needed(diff(before, volatile))
    bigger = Shape("public.t", (before.columns[0], Column(2, "n", "bigint")))
    assert not reread_needed(diff(before, bigger))
    assert reread_needed(diff(before, bigger, using=True))
    assert diff(before, bigger) == [Op("type", "n", type="bigint", old_type="integer")]


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=10))
def test_a_malformed_shape_is_refused_never_crashes(data: Any) -> None:
    with contextlib.suppress(ShapeError):
        parse_shape(data if isinstance(data, dict) else {"table": "t", "columns": data})
