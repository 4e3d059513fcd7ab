"""What the translator is told about each asset: one small frozen record per kind of asset.

`CdcTranslator.get_asset_spec(data)` turns a record into an `AssetSpec`; the YAML component's
`translation` templates see the record as `data` (e.g. ``{{ data.kind }}``, ``{{ data.name }}``,
``{{ data.sink.destination.type }}``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cdc_pipeline.config import PipelineConfig, SinkConfig, TableConfig
from cdc_pipeline.config.api_sources import ApiCollectionConfig, ApiSourceConfig


@dataclass(frozen=True, eq=False)
class SourceTableData:
    """A table the pipeline reads (configured, or only named by a sink): not materialized here."""

    kind: ClassVar[str] = "source_table"
    pipeline: PipelineConfig
    table: str  # schema.table

    @property
    def name(self) -> str:
        return self.table

    @property
    def schema_name(self) -> str:
        return self.table.partition(".")[0]

    @property
    def table_name(self) -> str:
        return self.table.partition(".")[2]


@dataclass(frozen=True, eq=False)
class ChangeLogData:
    """The ordered change log the drain writes, downstream of every source table."""

    kind: ClassVar[str] = "change_log"
    pipeline: PipelineConfig

    @property
    def name(self) -> str:
        return "change_log"


@dataclass(frozen=True, eq=False)
class SnapshotData:
    """A configured table's backfill: its rows as read messages in the change log."""

    kind: ClassVar[str] = "snapshot"
    pipeline: PipelineConfig
    table: TableConfig

    @property
    def name(self) -> str:
        return self.table.qualified


@dataclass(frozen=True, eq=False)
class SinkData:
    """What a sink holds: the change log (and snapshots) of its tables, delivered."""

    kind: ClassVar[str] = "sink"
    pipeline: PipelineConfig
    sink: SinkConfig

    @property
    def name(self) -> str:
        return self.sink.name


@dataclass(frozen=True, eq=False)
class ApiCollectionData:
    """One collection of an API source, synced into its table."""

    kind: ClassVar[str] = "api_collection"
    pipeline: PipelineConfig
    source: ApiSourceConfig
    collection: ApiCollectionConfig

    @property
    def name(self) -> str:
        return f"{self.source.name}.{self.collection.name.strip('/').replace('/', '_')}"


AssetData = SourceTableData | ChangeLogData | SnapshotData | SinkData | ApiCollectionData
