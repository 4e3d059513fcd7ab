"""Delta sink: a table per source table at `<path>/<table>`, written through delta-rs.

Mirror: one MERGE per table and call (matched: delete or update; not matched: insert; after a TRUNCATE,
rows the batch does not name are deleted by the same MERGE); append: one append. Each commit carries the
sink's marks as transaction identifiers (lake/position.py), so the data and the position land together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
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
        table = self.dt.to_pyarrow_dataset().to_table(filter=_key_filter(pk, keys))
        return {tuple(r[k] for k in pk): r for r in table.to_pylist()}

    def keys_between(self, low: Position, high: Position) -> set[str]:
        self.dt.update_incremental()
        f = (pc.field("commit_lsn") >= low[0]) & (pc.field("commit_lsn") <= high[0])
        table = self.dt.to_pyarrow_dataset().to_table(columns=["idempotency_key"], filter=f)
        return set(table.column("idempotency_key").to_pylist())

    def _props(self, key: str, marks: position.Marks) -> CommitProperties:
        versions = position.delta_versions(marks)
        return CommitProperties(max_commit_retries=COMMIT_RETRIES, app_transactions=[
            Transaction(app, versions[name]) for name, app in position.delta_app_ids(key).items()])

    def commit_mirror(self, truncate: bool, batch: pa.Table, pk: Sequence[str], key: str,
                      marks: position.Marks) -> None:
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
        write_deltalake(self.dt, batch, mode="append", target_file_size=self.target_file_size,
                        commit_properties=self._props(key, marks))


def _key_filter(pk: Sequence[str], keys: list[effects.Key]) -> pc.Expression:
    if len(pk) == 1:
        return pc.field(pk[0]).isin([k[0] for k in keys])
    expr: pc.Expression | None = None
    for key in keys:
        one = pc.field(pk[0]) == key[0]
        for name, v in zip(pk[1:], key[1:], strict=True):
            one = one & (pc.field(name) == v)
        expr = one if expr is None else expr | one
    assert expr is not None
    return expr


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
