"""Decoded pgoutput row messages -> change-log rows (pure: values in, values out)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cdc_pipeline.capture.json_text import Fragment, escape_nul, fragment_for, fragment_for_type, quote_name
from cdc_pipeline.postgres.pgoutput import UNCHANGED_TOAST, Delete, Insert, Relation, Update
from cdc_pipeline.postgres.pgtypeinfo import PgType, TextRule, mirror_plan

# (commit_lsn, commit_idx, xid, table_schema, table_name, action, pk, record, changes, commit_ts, backfill_id,
#  texts, annotations)
LogRow = tuple[int, int, int, str, str, str, str | None, str | None, str | None, datetime, str | None, str | None,
               str | None]
LOG_COLUMNS = (
    "commit_lsn", "commit_idx", "xid", "table_schema", "table_name", "action", "pk", "record", "changes",
    "commit_ts", "backfill_id", "texts", "annotations",
)


@dataclass(frozen=True, slots=True)
class RelationShape:
    """What the drain needs to know about one relation, precomputed once per Relation message."""

    relation_id: int
    schema: str
    name: str
    columns: tuple[str, ...]
    type_oids: tuple[int, ...]
    keys: tuple[str, ...]  # JSON-quoted column names followed by ':'
    encoders: tuple[Fragment, ...]
    pk_idx: tuple[int, ...]
    # Per column: when a value's text goes into the log's `texts` for a mirror (postgres/pgtypeinfo.py).
    text_rules: tuple[TextRule, ...] = ()
    text_idx: tuple[int, ...] = ()  # the columns whose rule is not NEVER

    @classmethod
    def from_relation(cls, rel: Relation, primary_key: tuple[str, ...] | None,
                      types: dict[int, PgType] | None = None) -> RelationShape:
        """``types``: the columns' types from the catalog (catalog.load_types); without them, built-in types
        are known by OID and every other value is its text as a JSON string."""
        names = tuple(c.name for c in rel.columns)
        rules = tuple(mirror_plan(types[c.type_oid], "").rule if types and c.type_oid in types else TextRule.NEVER
                      for c in rel.columns)
        if primary_key and all(k in names for k in primary_key):
            pk_idx = tuple(names.index(k) for k in primary_key)
        else:  # no primary key known: fall back to the replica identity's key columns
            pk_idx = tuple(i for i, c in enumerate(rel.columns) if c.flags & 1)
        return cls(
            relation_id=rel.relation_id,
            schema=rel.namespace,
            name=rel.name,
            columns=names,
            type_oids=tuple(c.type_oid for c in rel.columns),
            keys=tuple(quote_name(n) + ":" for n in names),
            encoders=tuple(fragment_for_type(types[c.type_oid]) if types and c.type_oid in types
                           else fragment_for(c.type_oid) for c in rel.columns),
            pk_idx=pk_idx,
            text_rules=rules,
            text_idx=tuple(i for i, r in enumerate(rules) if r is not TextRule.NEVER),
        )


def _encode(shape: RelationShape, values: tuple[object, ...]) -> list[str | None]:
    """One JSON fragment per column; None marks an unchanged TOAST value (unknown, so left out)."""
    out: list[str | None] = []
    for enc, v in zip(shape.encoders, values, strict=True):
        if v is None:
            out.append("null")
        elif v is UNCHANGED_TOAST:
            out.append(None)
        else:
            out.append(enc(v))  # type: ignore[arg-type]
    return out


def _texts(shape: RelationShape, values: tuple[object, ...]) -> str | None:
    """The texts a mirror needs of this row's values (a JSON object), or None."""
    if not shape.text_idx:  # the common case: no column of the table ever needs its text
        return None
    pairs = []
    for i in shape.text_idx:
        v, rule = values[i], shape.text_rules[i]
        if isinstance(v, bytes) and rule.wants(v):  # not NULL, not an unchanged TOAST value
            pairs.append(shape.keys[i] + quote_name(escape_nul(v.decode()) if rule is TextRule.JSON else v.decode()))
    return "{" + ",".join(pairs) + "}" if pairs else None


def _record(shape: RelationShape, frags: list[str | None]) -> str:
    return "{" + ",".join(k + f for k, f in zip(shape.keys, frags, strict=True) if f is not None) + "}"


def _pk(shape: RelationShape, frags: list[str | None]) -> str | None:
    if not shape.pk_idx:
        return None
    parts = [frags[i] for i in shape.pk_idx]
    if any(p is None for p in parts):
        return None
    return "[" + ", ".join(parts) + "]"  # type: ignore[arg-type]


def row_change(
    shape: RelationShape, msg: Insert | Update | Delete, lsn: int, idx: int, xid: int, ts: datetime,
    annotations: str | None = None,
) -> LogRow:
    """``annotations``: the transaction's annotation JSON in force at this change (capture/annotations.py)."""
    if isinstance(msg, Insert):
        frags = _encode(shape, msg.new)
        return (lsn, idx, xid, shape.schema, shape.name, "insert", _pk(shape, frags), _record(shape, frags),
                None, ts, None, _texts(shape, msg.new), annotations)
    if isinstance(msg, Delete):
        frags = _encode(shape, msg.old)
        return (lsn, idx, xid, shape.schema, shape.name, "delete", _pk(shape, frags), _record(shape, frags),
                None, ts, None, _texts(shape, msg.old), annotations)
    new = _encode(shape, msg.new)
    raw_new = msg.new
    changes = "{}"
    if msg.old is not None:
        old = _encode(shape, msg.old)
        if msg.old_kind == "O":
            # REPLICA IDENTITY FULL: an unchanged TOAST value can be filled from the old tuple.
            new = [o if n is None else n for n, o in zip(new, old, strict=True)]
            raw_new = tuple(o if n is UNCHANGED_TOAST else n for n, o in zip(msg.new, msg.old, strict=True))
            pairs = [
                (k, o) for k, o, n, raw_old in zip(shape.keys, old, new, msg.old, strict=True)
                if o is not None and raw_old is not UNCHANGED_TOAST and o != n
            ]
        else:  # 'K': only the key's old values are sent, because the key changed
            pairs = [(shape.keys[i], old[i]) for i in shape.pk_idx if old[i] != new[i] and old[i] is not None]
        changes = "{" + ",".join(k + o for k, o in pairs) + "}"  # type: ignore[operator]
    return (lsn, idx, xid, shape.schema, shape.name, "update", _pk(shape, new), _record(shape, new),
            changes, ts, None, _texts(shape, raw_new), annotations)


def truncate_row(shape: RelationShape, lsn: int, idx: int, xid: int, ts: datetime,
                 annotations: str | None = None) -> LogRow:
    return (lsn, idx, xid, shape.schema, shape.name, "truncate", None, None, None, ts, None, None, annotations)
