"""The sink loop both lake formats share: a call's messages parsed and checked, split by source table, and
each table's part written in one atomic commit that also records the sink's marks (position.py).

Exactly once: on redelivery (the engine's offset commits after the table's), messages up to a table's
recorded position are acknowledged without being written again; an append table also skips the ones it
holds between its two marks. A mirror's batch is reduced to one effect per key (effects.py), so applying a
window again (a replay) leaves the table as it was.

A message whose values the lake type cannot hold exactly fails (named column); the call stops there: what
precedes it is written, the results end at it (what follows is not attempted: the engine hands it back).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import pyarrow as pa

from cdc_pipeline.core.positions import Position
from cdc_pipeline.postgres.oids import FIRST_USER_OID
from cdc_pipeline.sinks.base import OutboundMessage, Sink, SinkConfigLike, SinkUnavailable
from cdc_pipeline.sinks.lake import effects, fault, rows, values
from cdc_pipeline.sinks.lake.position import NONE, Marks


class LakeTable(Protocol):
    """One lake table, opened (created if missing) by the format's client."""

    fields: tuple[tuple[str, pa.DataType], ...]  # its columns now

    def marks(self, key: str) -> Marks | None: ...
    def add_columns(self, new: Sequence[tuple[str, pa.DataType]]) -> None: ...
    def rows_by_key(self, pk: Sequence[str], keys: list[effects.Key]) -> dict[effects.Key, dict[str, Any]]: ...
    def keys_between(self, low: Position, high: Position) -> set[str]: ...
    def commit_mirror(self, truncate: bool, batch: pa.Table, pk: Sequence[str], key: str, marks: Marks) -> None: ...
    def commit_append(self, batch: pa.Table, key: str, marks: Marks) -> None: ...


class LakeSink(Sink):
    fmt: ClassVar[values.Format]
    transient: ClassVar[tuple[type[BaseException], ...]] = (OSError,)  # the format adds its own
    python_calendar: ClassVar[bool] = False  # dates limited to years 1-9999 (a writer's limit)

    def __init__(self, sink_config: Any) -> None:
        self.name = sink_config.name
        self.dest = sink_config.destination
        self.append = self.dest.mode == "append"
        self.holds_rows = not self.append
        self._tables: dict[str, LakeTable] = {}
        self._marks: dict[tuple[str, str], Marks] = {}  # by (position key, table): a lane's own, read once

    # -- capabilities (sinks/base.py) ---------------------------------------------------------------------
    @classmethod
    def takes_truncates(cls, sink_config: SinkConfigLike) -> bool:
        return bool(sink_config.destination.mode == "mirror")

    @classmethod
    def takes_texts(cls, sink_config: SinkConfigLike) -> bool:
        return True  # both modes write the source's values, typed

    @classmethod
    def gather_seconds(cls, sink_config: SinkConfigLike) -> float:
        return float(sink_config.destination.flush_seconds)

    @classmethod
    def destination_tables(cls, sink_config: SinkConfigLike) -> list[str]:
        return sorted({sink_config.destination.table_for(t) for t in sink_config.tables})

    def close(self) -> None:
        self._tables.clear()
        self._marks.clear()

    # -- the format's part ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def open_table(self, name: str, schema: pa.Schema, primary_key: Sequence[str]) -> LakeTable:
        """The table `name`, created with `schema` (and the configured partitioning) if missing."""

    # -- delivery --------------------------------------------------------------------------------------
    def shape(self, source: str) -> rows.Shape:
        info = self.context.describe(source)
        if info is None:
            raise ValueError(f"no description of the source table {source}")
        if not self.append and not info.primary_key:
            raise ValueError(f"mirror of {source}: the source table has no primary key")
        fields = tuple((c.name, values.arrow_type(values.base_type(c.type_sql, c.type_oid, c.mirror_type,
                                                                    FIRST_USER_OID), self.fmt)) for c in info.columns)
        return rows.Shape(source, fields, tuple(info.primary_key))

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        if not batch:
            return []
        parsed: list[rows.Parsed] = []
        shapes: dict[str, rows.Shape] = {}
        error: str | None = None
        for m in batch:
            error = self._check(m, parsed, shapes)
            if error is not None:
                break
        if parsed:
            try:
                self._write(parsed, shapes, Marks.of(parsed[-1].position, self.context.ceiling))
            except self.transient as exc:
                raise SinkUnavailable(f"{self.fmt} sink {self.name!r}: {type(exc).__name__}: "
                                      f"{_first_line(exc)}") from exc
        written: list[str | None] = [None] * len(parsed)
        return written if error is None else [*written, error]

    def _check(self, m: OutboundMessage, parsed: list[rows.Parsed], shapes: dict[str, rows.Shape]) -> str | None:
        """Parse `m` into `parsed`, or say why it cannot be written."""
        try:
            p = rows.parse(m.payload)
            if p.source not in shapes:
                shapes[p.source] = self.shape(p.source)
        except (ValueError, KeyError, TypeError) as exc:
            return f"{self.fmt} sink {self.name!r}: {type(exc).__name__}: {_first_line(exc)}"
        if p.change.action not in ("truncate", "schema"):  # a schema change: its columns come from describe()
            typed = rows.typed_change(shapes[p.source], p.change, self.python_calendar)
            if isinstance(typed, str):
                return typed
            p.change = typed
        parsed.append(p)
        return None

    def _write(self, parsed: list[rows.Parsed], shapes: dict[str, rows.Shape], marks: Marks) -> None:
        by_table: dict[str, list[rows.Parsed]] = {}
        for p in parsed:
            by_table.setdefault(p.source, []).append(p)
        for source, messages in by_table.items():
            self._write_table(self.dest.table_for(source), messages, shapes[source], marks)

    def _write_table(self, name: str, messages: list[rows.Parsed], source: rows.Shape, marks: Marks) -> None:
        """One table's part of a call, in one commit with the marks; what the table holds already skipped."""
        table = self._table(name, source)
        key = self.context.position_key  # the lane's in the current split (sinks/base.py SinkContext)
        done = self._marks.get((key, name))
        if done is None:
            done = self._marks[(key, name)] = table.marks(key) or Marks(NONE, NONE)
        todo = [p for p in messages if p.position > done.position and p.change.action != "schema"]
        if self.append and todo and done.applied > done.position:
            present = table.keys_between(done.position, done.applied)
            todo = [p for p in todo if f"{p.position[0]}:{p.position[1]}" not in present]
        if not todo:
            return
        fields = tuple(f for f in table.fields if not (self.append and f[0] in rows.HISTORY_NAMES))
        shape = rows.Shape(source.source, fields, source.primary_key)
        if self.append:
            data = rows.append_table(shape, todo)
            fault.reached("before_commit")
            table.commit_append(data, key, marks)
        else:
            reduced = effects.reduce((p.change for p in todo), shape.primary_key, source.columns)
            batch = rows.mirror_table(shape, reduced, lambda keys: table.rows_by_key(shape.primary_key, keys))
            fault.reached("before_commit")
            table.commit_mirror(reduced.truncate, batch, shape.primary_key, key, marks)
        fault.reached("after_commit")
        self._marks[(key, name)] = marks

    def _table(self, name: str, shape: rows.Shape) -> LakeTable:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = self.open_table(name, shape.schema(self.append), shape.primary_key)
        have = {n for n, _ in table.fields}
        new = [(n, t) for n, t in shape.fields if n not in have]
        if new:  # the source gained columns: the format's schema evolution
            table.add_columns(new)
        return table


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
