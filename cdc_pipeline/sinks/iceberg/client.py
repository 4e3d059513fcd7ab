"""Iceberg sink: a table per source table (`namespace.table`), written through pyiceberg.

Mirror: one transaction per table and call: delete the keys the batch names (every row after a TRUNCATE),
append their new rows; append: one append. Every snapshot the transaction makes carries the sink's marks as
summary properties (lake/position.py); the catalog commits the transaction at once, data and marks together.
A commit that loses a race with another writer is retried on the refreshed table.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
    ValidationException,
)
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    In,
    LessThanOrEqual,
    Or,
)
from pyiceberg.table import Table
from sqlalchemy.exc import SQLAlchemyError

from cdc_pipeline.core.positions import Position
from cdc_pipeline.sinks.base import SinkConfigLike
from cdc_pipeline.sinks.iceberg.catalog import load_catalog
from cdc_pipeline.sinks.lake import effects, position
from cdc_pipeline.sinks.lake.rows import KIND
from cdc_pipeline.sinks.lake.sink import LakeSink

COMMIT_ATTEMPTS = 20
TRANSFORMS = ("year", "month", "day", "hour")


def partition_field(spec: str) -> tuple[str, str]:
    """`col` (identity) or `day(col)` (also year, month, hour) -> (column, transform)."""
    name, _, rest = spec.partition("(")
    if rest and name in TRANSFORMS and rest.endswith(")"):
        return rest[:-1], name
    return spec, "identity"


class IcebergTableHandle:
    def __init__(self, catalog: Any, ident: tuple[str, str], schema: pa.Schema, partition_by: list[str],
                 target_file_size: int) -> None:
        self.catalog, self.ident = catalog, ident
        try:
            self.table: Table = catalog.load_table(ident)
        except NoSuchTableError:
            self.table = self._create(schema, partition_by, target_file_size)
        self._load_fields()

    def _create(self, schema: pa.Schema, partition_by: list[str], target_file_size: int) -> Table:
        with contextlib.suppress(NamespaceAlreadyExistsError):
            self.catalog.create_namespace(self.ident[0])
        try:
            table = self.catalog.create_table(self.ident, schema, properties={
                "format-version": "2", "write.target-file-size-bytes": str(target_file_size)})
        except TableAlreadyExistsError:  # another sink or lane created it meanwhile
            return self.catalog.load_table(self.ident)
        if partition_by:
            with table.update_spec() as spec:
                for item in partition_by:
                    column, transform = partition_field(item)
                    spec.add_field(column, transform, f"{column}_{transform}" if transform != "identity" else column)
        return table

    def _load_fields(self) -> None:
        schema = self.table.schema().as_arrow()
        self.fields = tuple((f.name, f.type) for f in schema)

    def marks(self, key: str) -> position.Marks | None:
        self.table = self.catalog.load_table(self.ident)
        snapshot = self.table.current_snapshot()
        while snapshot is not None:  # back through the ancestry: another writer may have committed since
            found = position.iceberg_read(key, snapshot.summary.additional_properties if snapshot.summary else {})
            if found is not None:
                return found
            parent = snapshot.parent_snapshot_id
            snapshot = self.table.snapshot_by_id(parent) if parent is not None else None
        return None

    def add_columns(self, new: Sequence[tuple[str, pa.DataType]]) -> None:
        self._retry(lambda: self._add(new))
        self._load_fields()

    def _add(self, new: Sequence[tuple[str, pa.DataType]]) -> None:
        with self.table.update_schema() as update:
            update.union_by_name(pa.schema(list(new)))

    def rows_by_key(self, pk: Sequence[str], keys: list[effects.Key]) -> dict[effects.Key, dict[str, Any]]:
        table = self.table.scan(row_filter=_key_filter(pk, keys)).to_arrow()
        return {tuple(r[k] for k in pk): r for r in table.to_pylist()}

    def keys_between(self, low: Position, high: Position) -> set[str]:
        expr = And(GreaterThanOrEqual("commit_lsn", low[0]), LessThanOrEqual("commit_lsn", high[0]))
        table = self.table.scan(row_filter=expr, selected_fields=("idempotency_key",)).to_arrow()
        return set(table.column("idempotency_key").to_pylist())

    def commit_mirror(self, truncate: bool, batch: pa.Table, pk: Sequence[str], key: str,
                      marks: position.Marks) -> None:
        props = position.iceberg_properties(key, marks)
        upserts = batch.filter(pc.equal(batch.column(KIND), "upsert")).drop_columns([KIND])
        keys = [tuple(r[k] for k in pk) for r in batch.select(list(pk)).to_pylist()]

        def commit() -> None:
            with self.table.transaction() as tx, warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Delete operation did not match")  # keys new to the table
                if truncate or keys:
                    tx.delete(AlwaysTrue() if truncate else _key_filter(pk, keys), snapshot_properties=props)
                if upserts.num_rows:
                    tx.append(upserts.cast(self._arrow_schema(upserts)), snapshot_properties=props)

        self._retry(commit)

    def commit_append(self, batch: pa.Table, key: str, marks: position.Marks) -> None:
        props = position.iceberg_properties(key, marks)
        self._retry(lambda: self.table.append(batch.cast(self._arrow_schema(batch)), snapshot_properties=props))

    def _arrow_schema(self, batch: pa.Table) -> pa.Schema:
        """The batch's columns in the table's order and types (pyiceberg wants the table's own)."""
        by_name = dict(self.fields)
        return pa.schema([(n, by_name.get(n, batch.schema.field(n).type)) for n in batch.column_names])

    def _retry(self, action: Callable[[], None]) -> None:
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                action()
                return
            except (CommitFailedException, ValidationException):  # another writer of the table committed first
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise
                time.sleep(min(0.05 * (attempt + 1), 0.5))  # a concurrent writer committed first: back off
                self.table = self.catalog.load_table(self.ident)


def _key_filter(pk: Sequence[str], keys: list[effects.Key]) -> BooleanExpression:
    if len(pk) == 1:
        return In(pk[0], {k[0] for k in keys})
    ors: list[BooleanExpression] = []
    for key in keys:
        parts = [EqualTo(name, v) for name, v in zip(pk, key, strict=True)]
        ors.append(And(*parts) if len(parts) > 1 else parts[0])
    return Or(*ors) if len(ors) > 1 else ors[0]


class IcebergSink(LakeSink):
    fmt = "iceberg"
    transient = (OSError, CommitFailedException, SQLAlchemyError)
    python_calendar = True  # pyiceberg's writer turns each file's min/max into Python dates

    def __init__(self, sink_config: Any) -> None:
        super().__init__(sink_config)
        self._catalog: Any = None

    @classmethod
    def asset_metadata(cls, sink_config: SinkConfigLike) -> dict[str, str]:
        dest = sink_config.destination
        return {"destination_tables": ", ".join(cls.destination_tables(sink_config)),
                "location": dest.warehouse.split("?")[0], "format": "iceberg", "mode": dest.mode,
                "catalog": f"{dest.catalog.type} ({dest.catalog.name})"}

    def close(self) -> None:
        super().close()
        if self._catalog is not None and hasattr(self._catalog, "engine"):
            self._catalog.engine.dispose()  # a SQL catalog's pooled connections
        self._catalog = None

    def catalog(self) -> Any:
        if self._catalog is None:
            # The state database is where the default SQL catalog lives (sinks/base.py SinkContext).
            self._catalog = load_catalog(self.dest, self.context.state_dsn, self.context.schema)
        return self._catalog

    def open_table(self, name: str, schema: pa.Schema, primary_key: Sequence[str]) -> IcebergTableHandle:
        namespace, _, table = name.rpartition(".")
        return IcebergTableHandle(self.catalog(), (namespace or "default", table), schema,
                                  list(self.dest.partition_by), self.dest.target_file_size)
