"""A table's schema history: two shapes of a table (before and after a DDL statement, as the source's event
trigger describes them) -> the operations a mirror applies to follow it. Pure: values in, values out.

Columns are matched by ``attnum`` (PostgreSQL never reuses one), so a renamed column is a rename, not a drop
and an add, and a dropped column re-added under the same name is a new column. The operations, in order:
drops, renames (a rename onto a name another column is leaving works because drops come first; a swap of
two names goes through a temporary name), type changes, adds. ``apply_to_rows`` is the model of what a mirror
does with them, for the property tests (a sequence of DDL and changes replayed gives the source's table).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

OpKind = Literal["add", "drop", "rename", "type", "not_null", "default", "rename_table", "attach", "detach"]
# Operations a mirror's table follows (the others are recorded in the history only).
MIRRORED: frozenset[str] = frozenset({"add", "drop", "rename", "type"})


class ShapeError(ValueError):
    """A shape that is not a well-formed table description."""


@dataclass(frozen=True, slots=True)
class Column:
    attnum: int
    name: str
    type: str  # format_type(atttypid, atttypmod)
    type_oid: int = 0
    not_null: bool = False
    default: str | None = None  # pg_get_expr(adbin)
    missing: str | None = None  # the value rows that existed before an ADD COLUMN hold (attmissingval), as text
    generated: str = ""  # attgenerated: '' or 's' (stored)


@dataclass(frozen=True, slots=True)
class Shape:
    table: str  # schema.table as it is named now
    columns: tuple[Column, ...]
    partitions: tuple[str, ...] = ()

    def by_attnum(self) -> dict[int, Column]:
        return {c.attnum: c for c in self.columns}

    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


@dataclass(frozen=True, slots=True)
class Op:
    kind: OpKind
    column: str = ""  # the column (its name before a rename)
    new_name: str = ""  # rename / rename_table: the new name
    type: str = ""  # add / type: the new type
    old_type: str = ""  # type: the old type
    missing: str | None = None  # add: what rows that existed hold
    detail: str = ""  # default / not_null: the new definition; attach: the partition
    reread: bool = False  # the source rewrote the rows without decoding them: they must be read again
    generated: str = ""  # add: the generation expression of a generated column the stream leaves out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.kind}
        for name in ("column", "new_name", "type", "old_type", "detail", "generated"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        if self.kind == "add":
            out["missing"] = self.missing
        if self.reread:
            out["reread"] = True
        return out

    def describe(self) -> str:
        """The operation as a person would write it."""
        return {
            "add": f"ADD COLUMN {self.column} {self.type}" + (f" (existing rows: {self.missing})"
                                                             if self.missing is not None else ""),
            "drop": f"DROP COLUMN {self.column}",
            "rename": f"RENAME COLUMN {self.column} TO {self.new_name}",
            "type": f"ALTER COLUMN {self.column} TYPE {self.type} (was {self.old_type})",
            "not_null": f"ALTER COLUMN {self.column} {self.detail}",
            "default": f"ALTER COLUMN {self.column} {self.detail}",
            "rename_table": f"RENAME TO {self.new_name}",
            "attach": f"ATTACH PARTITION {self.detail}",
            "detach": f"DETACH PARTITION {self.detail}",
        }[self.kind]


def parse_shape(data: Mapping[str, Any]) -> Shape:
    """A shape from its JSON (the event trigger's ``ddl_shape``); ShapeError when malformed."""
    try:
        columns = tuple(Column(int(c["attnum"]), _text(c["name"]), _text(c["type"]), int(c.get("type_oid") or 0),
                               bool(c.get("not_null")), _opt(c.get("default")), _opt(c.get("missing")),
                               _flag(c.get("generated"))) for c in data["columns"])
        shape = Shape(_text(data["table"]), columns, tuple(_text(p) for p in data.get("partitions") or ()))
    except (KeyError, TypeError, ValueError) as exc:
        raise ShapeError(f"not a table shape: {type(exc).__name__}: {exc}") from None
    if len({c.attnum for c in columns}) != len(columns) or len(set(shape.names())) != len(columns):
        raise ShapeError("not a table shape: a column number or name repeats")
    return shape


def _text(value: object) -> str:
    if not isinstance(value, str) or not value or "\x00" in value:
        raise ValueError(f"expected a non-empty string, got {type(value).__name__}")
    return value


def _flag(value: object) -> str:
    if value not in (None, "", "s", "v"):
        raise ValueError("a generated flag other than '', 's', 'v'")
    return str(value or "")


def _opt(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"expected a string or null, got {type(value).__name__}")
    return value


def diff(before: Shape, after: Shape, using: bool = False) -> list[Op]:
    """What changed from ``before`` to ``after``, in the order a mirror applies it (module docstring).
    ``using``: the statement gave a USING clause, so a changed type's values may not be a plain cast's."""
    old, new = before.by_attnum(), after.by_attnum()
    ops: list[Op] = [Op("drop", c.name) for n, c in old.items() if n not in new]
    ops += _renames([(old[n].name, new[n].name) for n in sorted(old) if n in new and old[n].name != new[n].name],
                    set(after.names()) | set(before.names()))
    for n in sorted(set(old) & set(new)):
        a, b = old[n], new[n]
        if a.type != b.type:
            ops.append(Op("type", b.name, type=b.type, old_type=a.type, reread=using))
        if a.not_null != b.not_null:
            ops.append(Op("not_null", b.name, detail="SET NOT NULL" if b.not_null else "DROP NOT NULL"))
        if a.default != b.default:
            ops.append(Op("default", b.name, detail=f"SET DEFAULT {b.default}" if b.default else "DROP DEFAULT"))
    for n in sorted(set(new) - set(old)):
        c = new[n]
        # A default without a missing value: the source rewrote the table, giving each row its own value
        # (a volatile default, or a generated column), and decoded none of it.
        ops.append(Op("add", c.name, type=c.type, missing=c.missing,
                      reread=bool(c.generated) or (c.default is not None and c.missing is None)))
    ops += [Op("attach", detail=p) for p in after.partitions if p not in before.partitions]
    ops += [Op("detach", detail=p) for p in before.partitions if p not in after.partitions]
    if before.table != after.table:
        ops.append(Op("rename_table", before.table, new_name=after.table))
    return ops


def _renames(pairs: list[tuple[str, str]], taken: set[str]) -> list[Op]:
    """Renames applied one at a time: one whose new name another pending rename still holds waits; a cycle
    (a swap) is broken through a temporary name."""
    pending, ops = list(pairs), []
    while pending:
        holding = {old for old, _ in pending}
        ready = [(o, n) for o, n in pending if n not in holding]
        if not ready:  # a cycle: move one aside
            o, n = pending[0]
            temp = _temporary(o, taken)
            taken.add(temp)
            ops.append(Op("rename", o, new_name=temp))
            pending[0] = (temp, n)
            continue
        for o, n in ready:
            ops.append(Op("rename", o, new_name=n))
            pending.remove((o, n))
    return ops


def _temporary(name: str, taken: set[str]) -> str:
    i = 0
    while f"_cdc_{i}_{name}"[:63] in taken:
        i += 1
    return f"_cdc_{i}_{name}"[:63]


def reread_needed(ops: Iterable[Op]) -> bool:
    return any(op.reread for op in ops)


def with_types(ops: Sequence[Op], mirror_type: Mapping[str, str]) -> list[Op]:
    """The ops with each new type replaced by the type a mirror gives it (source type -> mirror type)."""
    return [replace(op, type=mirror_type.get(op.type, op.type)) if op.type else op for op in ops]


def apply_to_rows(rows: list[dict[str, Any]], ops: Iterable[Op], parse: Any = None) -> list[dict[str, Any]]:
    """The model of a mirror following ``ops`` (the property tests' reference): each row dict by column name.
    ``parse`` turns an add's missing text into the row value (default: as it is)."""
    out = [dict(r) for r in rows]
    for op in ops:
        if op.kind not in MIRRORED:
            continue
        for row in out:
            if op.kind == "drop":
                row.pop(op.column, None)
            elif op.kind == "rename":
                row[op.new_name] = row.pop(op.column, None)
            elif op.kind == "add":
                row[op.column] = parse(op.missing) if parse and op.missing is not None else op.missing
    return out


def apply_to_columns(names: Sequence[str], ops: Iterable[Op]) -> list[str]:
    """The model of a mirror table's column names after ``ops`` (new columns last, as ALTER TABLE adds them)."""
    out = list(names)
    for op in ops:
        if op.kind == "drop" and op.column in out:
            out.remove(op.column)
        elif op.kind == "rename" and op.column in out:
            out[out.index(op.column)] = op.new_name
        elif op.kind == "add" and op.column not in out:
            out.append(op.column)
    return out
