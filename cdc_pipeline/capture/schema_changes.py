"""The drain's side of schema changes: a DDL message from the source's event trigger (admin/ddl_capture.py),
authenticated and checked, becomes a `schema` row of the change log at its position, with the table's
columns after it and the operations a mirror follows (capture/schema_history.py); the table's last change
goes into the `relations` table (status, metrics, Dagster). Without the trigger (`catalog` mode) a RELATION
message whose columns differ from the ones known before gives the same row, by column name.

What a mirror cannot follow from the stream alone (the source rewrote its rows without decoding them: a
volatile default, a USING clause, a partition attached with rows in it) is read again: the drain registers
a backfill of the table for its sinks after the batch commits, and runs it in its own process.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import psycopg

from cdc_pipeline.capture import rereads
from cdc_pipeline.capture.changes import LogRow, RelationShape
from cdc_pipeline.capture.gap import GapBackfills
from cdc_pipeline.capture.relations import as_configured, learn_relation
from cdc_pipeline.capture.schema_history import Column, Op, Shape, ShapeError, diff, parse_shape, with_types
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.postgres import catalog, pgoutput
from cdc_pipeline.postgres.pgtypeinfo import mirror_plan
from cdc_pipeline.state import relations
from cdc_pipeline.state.relations import record_schema_change

log = logging.getLogger(__name__)

MAX_CONTENT = 4 * 1024 * 1024  # a table of 1,600 columns describes itself in well under this


@dataclass(frozen=True)
class DdlMessage:
    publication: str
    relid: int
    tag: str
    before: Shape | None
    after: Shape
    filled: tuple[str, ...]
    using: bool


def verify(content: bytes, key: bytes) -> DdlMessage | str:
    """The message, or why it is refused (never its content: it may be anyone's)."""
    if len(content) > MAX_CONTENT:
        return "too long"
    mac, body = content[:64], content[64:]
    if not hmac.compare_digest(hmac.new(key, body, hashlib.sha256).hexdigest().encode(), mac):
        return "no valid signature of the pipeline's event trigger"
    try:
        data = json.loads(body)
        if data.get("v") != 1:
            return "an unknown version"
        before = parse_shape(data["before"]) if data.get("before") is not None else None
        return DdlMessage(str(data["publication"]), int(data["relid"]), str(data["tag"]), before,
                          parse_shape(data["after"]), tuple(str(p) for p in data.get("filled") or ()),
                          bool(data.get("using")))
    except (ValueError, KeyError, TypeError, AttributeError, ShapeError) as exc:
        return f"malformed ({type(exc).__name__})"


def named_shape(table: str, columns: list[tuple[str, str, int]], numbers: dict[str, int]) -> Shape:
    """Columns (name, type as SQL, type OID) as a Shape numbered by name (catalog mode: a column keeps its
    number while its name stays; a rename cannot be told from a drop and an add there)."""
    out = []
    for name, type_sql, oid in columns:
        numbers.setdefault(name, len(numbers) + 1)
        out.append(Column(numbers[name], name, type_sql, oid))
    return Shape(table, tuple(out))


class SchemaChanges:
    """Per drain session: the key, the tables by configured name, and the re-reads to start."""

    def __init__(self, configured: frozenset[str], publication: str, schema: str) -> None:
        """``schema``: the state schema (its `relations` table)."""
        self.configured = configured
        self.publication = publication
        self.schema = schema
        self.key: bytes | None = None
        self.rereads: dict[str, str] = {}  # table -> why, registered after the batch commits

    def row(self, content: bytes, at: tuple[int, int, int, datetime, str | None], source: psycopg.Connection,
            state: psycopg.Connection) -> LogRow | str | None:
        """The `schema` log row of a DDL message (``at``: lsn, idx, xid, commit time, annotation); None when it
        is not for this pipeline's tables; why it is refused (the drain logs and counts it, never its content)."""
        if self.key is None:
            return "no event trigger installed for this pipeline (catalog mode)"
        msg = verify(content, self.key)
        if isinstance(msg, str):
            return msg
        table = self._configured_name(msg)
        if msg.publication != self.publication or table is None or msg.before is None:
            return None
        ops = diff(msg.before, msg.after, msg.using)
        return self._log_row(table, msg.before, msg.after, ops, msg.filled, at, source, state, msg.tag)

    def catalog_row(self, table: str, recorded: list[dict[str, Any]] | None, now: list[tuple[str, str, int]],
                    at: tuple[int, int, int, datetime, str | None], source: psycopg.Connection,
                    state: psycopg.Connection) -> LogRow | None:
        """Catalog mode: the row for a RELATION message whose columns (``now``: name, type as SQL, OID) differ
        from the ones recorded before it. An added column is read again: its existing rows' values (a
        default) and a rename are not in the stream."""
        if not recorded:
            return None
        was = [(str(c["name"]), str(c.get("type_sql") or c["type_oid"]), int(c["type_oid"])) for c in recorded]
        if [(n, t) for n, t, _ in was] == [(n, t) for n, t, _ in now]:
            return None
        numbers: dict[str, int] = {}
        before, after = named_shape(table, was, numbers), named_shape(table, now, numbers)
        ops = [replace(o, reread=True) if o.kind == "add" else o for o in diff(before, after)]
        return self._log_row(table, before, after, ops, (), at, source, state, "RELATION")

    def _configured_name(self, msg: DdlMessage) -> str | None:
        if msg.after.table in self.configured:
            return msg.after.table
        if msg.before is not None and msg.before.table in self.configured:
            return msg.before.table  # renamed: still logged under the configured name (status says so)
        return None

    def _log_row(self, table: str, before: Shape, after: Shape, ops: list[Op], filled: tuple[str, ...],
                 at: tuple[int, int, int, datetime, str | None], source: psycopg.Connection,
                 state: psycopg.Connection, tag: str) -> LogRow:
        lsn, idx, xid, ts, note = at
        ops = self._computed(source, after, ops)
        both = (*before.columns, *after.columns)
        types = catalog.load_types(source, {c.type_oid for c in both if c.type_oid})
        mirror = {c.type: mirror_plan(types[c.type_oid], c.type).sql if c.type_oid in types else "text" for c in both}
        ops = with_types(ops, mirror)
        why = [o.describe() for o in ops if o.reread]
        if filled:
            why.append(f"partition(s) {', '.join(filled)} attached with rows")
        if why:
            self.rereads[table] = "; ".join(why)
        summary = "; ".join(o.describe() for o in ops) or "no column change"
        record = {"table": after.table, "tag": tag, "summary": summary, "ops": [o.to_json() for o in ops],
                  "columns": [{"name": c.name, "type": mirror[c.type], "source_type": c.type}
                              for c in after.columns if not c.generated]}
        changes = {"columns": [{"name": c.name, "type": mirror[c.type], "source_type": c.type}
                               for c in before.columns if not c.generated]}
        schema, _, name = table.partition(".")
        record_schema_change(state, self.schema, schema, name, {"summary": summary, "lsn": lsn, "at": ts.isoformat(),
                                                               "renamed_to": after.table if after.table != table
                                                               else None, "reread": "; ".join(why) or None})
        log.warning("drain: schema change of %s at %X/%X: %s", table, lsn >> 32, lsn & 0xFFFFFFFF, summary)
        return (lsn, idx, xid, schema, name, "schema", None, json.dumps(record), json.dumps(changes), ts, None,
                None, note)

    def _computed(self, source: psycopg.Connection, after: Shape, ops: list[Op]) -> list[Op]:
        """An added generated column the stream leaves out (catalog.streamed_generated): no record holds it,
        so nothing is read again; a mirror computes it with the source's expression."""
        gen = {c.name: c for c in after.columns if c.generated and c.default}
        if not any(o.kind == "add" and o.column in gen for o in ops):
            return ops
        carried = catalog.publishes_generated(source, self.publication)
        return [replace(o, generated=str(gen[o.column].default), reread=False)
                if o.kind == "add" and o.column in gen and not (carried and gen[o.column].generated == "s") else o
                for o in ops]

    def on_relation(self, rel: pgoutput.Relation, source: psycopg.Connection, state: psycopg.Connection, write: bool,
                    at: tuple[int, int, int, datetime | None, str | None]) -> tuple[RelationShape, LogRow | None]:
        """A RELATION message: its shape (under the configured name of a partition's parent or a renamed
        table), and in catalog mode the `schema` row of a change of its columns since the recorded ones."""
        rel = as_configured(rel, source, self.configured, lambda rid: relations.name_of_relation(state, self.schema, rid))
        table = f"{rel.namespace}.{rel.name}"
        recorded = relations.relation_columns(state, self.schema).get(table) if write and self.key is None else None
        shape = learn_relation(rel, source, state, self.schema, self.publication, write)
        if recorded is None or table not in self.configured or at[3] is None:
            return shape, None
        now = [(c.name, t, c.type_oid) for c, t in zip(rel.columns, catalog.format_types(
            source, [(c.type_oid, c.type_modifier) for c in rel.columns]), strict=True)]
        return shape, self.catalog_row(table, recorded, now, (at[0], at[1], at[2], at[3], at[4]), source, state)

    def start_rereads(self, config: PipelineConfig, source: psycopg.Connection, state: psycopg.Connection,
                      runner: GapBackfills, lsn: int) -> None:
        """Register the re-reads the committed batch needs and start them in this process (capture/gap.py)."""
        rereads.register(config, source, self.rereads, lsn)
        self.rereads.clear()
        runner.start(state)
