"""Delta sink: a table per source table at `<path>/<table>`, written through delta-rs.

Mirror: one MERGE per table and call (matched: delete or update; not matched: insert; after a TRUNCATE,
rows the batch does not name are deleted by the same MERGE); append: one append. Each commit carries the
sink's marks as transaction identifiers (lake/position.py), so the data and the position land together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, DeltaProtocolError, TableNotFoundError

from cdc_pipeline.core.positions import Position
from cdc_pipeline.sinks.base import SinkConfigLike
from cdc_pipeline.sinks.lake import effects, position
from cdc_pipeline.sinks.lake.rows import KIND
from cdc_pipeline.sinks.lake.sink import LakeSink

COMMIT_RETRIES = 20  # concurrent writers of a table (lanes, several sinks): delta-rs retries a conflicting commit


def table_uri(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class DeltaTableHandle:
    def __init__(self, uri: str, storage: dict[str, str], schema: pa.Schema, partition_by: list[str],
                 target_file_size: int) -> None:
        self.uri, self.storage, self.target_file_size = uri, storage or None, target_file_size
        try:
            self.dt = DeltaTable(uri, storage_options=self.storage)
        except TableNotFoundError:
            self.dt = DeltaTable.create(uri, schema, mode="ignore", partition_by=partition_by or None,
                                        storage_options=self.storage)
        self._load_fields()

    def _load_fields(self) -> None:
        schema = pa.schema(self.dt.schema().to_arrow())
        self.fields = tuple((f.name, f.type) for f in schema)

    def marks(self, key: str) -> position.Marks | None:
        self.dt.update_incremental()
        return position.delta_read(key, self.dt.transaction_version)

    def add_columns(self, new: Sequence[tuple[str, pa.DataType]]) -> None:
        from deltalake.schema import Field, Schema

        fields = Schema.from_arrow(pa.schema(new)).fields
        self.dt.alter.add_columns([Field(f.name, f.type, nullable=True) for f in fields])
        self._load_fields()

    def rows_by_key(self, pk: Sequence[str], keys: list[effects.Key]) -> dict[effects.Key, dict[str, Any]]:
        self.dt.update_incremental()
        literal = _in_list(pk, keys)
        where = f" WHERE {literal}" if literal else ""  # else: every row, filtered here (rare key types)
        table = self._query(f"SELECT * FROM t{where}")
        wanted = set(keys)
        found = {tuple(r[k] for k in pk): r for r in table.to_pylist()}
        return {k: r for k, r in found.items() if k in wanted}

    def keys_between(self, low: Position, high: Position) -> set[str]:
        self.dt.update_incremental()
        table = self._query(f"SELECT idempotency_key FROM t WHERE commit_lsn BETWEEN {int(low[0])} AND {int(high[0])}")
        return set(table.column("idempotency_key").to_pylist())

    def _query(self, query: str) -> pa.Table:
        """Through delta-rs' own engine: pyarrow's dataset of the table turns file statistics into Python dates,
        which stop at year 1 (a BC date in a column fails the read)."""
        return pa.table(QueryBuilder().register("t", self.dt).execute(query))  # arro3 -> pyarrow

    def _props(self, key: str, marks: position.Marks) -> CommitProperties:
        versions = position.delta_versions(marks)
        return CommitProperties(max_commit_retries=COMMIT_RETRIES, app_transactions=[
            Transaction(app, versions[name]) for name, app in position.delta_app_ids(key).items()])

    def commit_mirror(self, truncate: bool, batch: pa.Table, pk: Sequence[str], key: str,
                      marks: position.Marks) -> None:
        self._retry(lambda: self._merge(truncate, batch, pk, key, marks))

    def _retry(self, action: Callable[[], None]) -> None:
        """A MERGE that another writer of the table (a lane, another sink) beat to its commit, done again on the
        table's new version (delta-rs retries only commits that conflict with nothing read)."""
        for attempt in range(COMMIT_RETRIES):
            try:
                action()
                return
            except CommitFailedError:
                if attempt == COMMIT_RETRIES - 1:
                    raise
                time.sleep(min(0.05 * (attempt + 1), 0.5))

    def _merge(self, truncate: bool, batch: pa.Table, pk: Sequence[str], key: str, marks: position.Marks) -> None:
        self.dt.update_incremental()
        props = self._props(key, marks)
        upserts = batch.filter(pc.equal(batch.column(KIND), "upsert")) if truncate else batch
        if truncate and upserts.num_rows == 0:
            self.dt.delete(commit_properties=props)
            return
        on = " AND ".join(f"t.{_quoted(k)} = s.{_quoted(k)}" for k in pk)
        merger = self.dt.merge(upserts, on, source_alias="s", target_alias="t", commit_properties=props)
        if truncate:
            merger = (merger.when_matched_update_all(except_cols=[KIND])
                      .when_not_matched_insert_all(except_cols=[KIND]).when_not_matched_by_source_delete())
        else:
            merger = (merger.when_matched_delete(f"s.{KIND} = 'delete'")
                      .when_matched_update_all(f"s.{KIND} = 'upsert'", except_cols=[KIND])
                      .when_not_matched_insert_all(f"s.{KIND} = 'upsert'", except_cols=[KIND]))
        merger.execute()

    def commit_append(self, batch: pa.Table, key: str, marks: position.Marks) -> None:
        self._retry(lambda: write_deltalake(self.dt, batch, mode="append", target_file_size=self.target_file_size,
                                            commit_properties=self._props(key, marks)))


def _in_list(pk: Sequence[str], keys: list[effects.Key]) -> str | None:
    """The keys as a SQL condition of literals; None when a key's type has no plain literal."""
    lits = [[_sql_literal(v) for v in key] for key in keys]
    if any(None in parts for parts in lits):
        return None
    if len(pk) == 1:
        return f"{_quoted(pk[0])} IN ({', '.join(str(parts[0]) for parts in lits)})"
    return " OR ".join("(" + " AND ".join(f"{_quoted(c)} = {p}" for c, p in zip(pk, parts, strict=True)) + ")"
                       for parts in lits)  # DataFusion has no row-value IN


def _sql_literal(v: Any) -> str | None:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | Decimal):
        return str(v)
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return None


class DeltaSink(LakeSink):
    fmt = "delta"
    transient = (OSError, CommitFailedError, DeltaError, DeltaProtocolError)

    @classmethod
    def asset_metadata(cls, sink_config: SinkConfigLike) -> dict[str, str]:
        dest = sink_config.destination
        return {"destination_tables": ", ".join(cls.destination_tables(sink_config)),
                "location": dest.path.split("?")[0], "format": "delta", "mode": dest.mode}

    def open_table(self, name: str, schema: pa.Schema, primary_key: Sequence[str]) -> DeltaTableHandle:
        return DeltaTableHandle(table_uri(self.dest.path, name), dict(self.dest.storage_options), schema,
                                list(self.dest.partition_by), self.dest.target_file_size)
