"""From the pipeline's config objects to Dagster asset keys and specs, in one place (the translator
pattern of dagster-dlt and dagster-sling): subclass `CdcTranslator` and pass it to
`build_definitions` to rename keys, regroup assets or add metadata.

Keys name data, not actions: ``source/<schema>/<table>`` (the source tables, not materialized here),
``cdc/change_log`` (the ordered log the drain writes), ``cdc/snapshot/<schema>/<table>`` (a table's
backfill: its rows as read messages in the log), ``sink/<name>`` (what a sink holds).
"""

from __future__ import annotations

from dagster import AssetKey, AssetSpec

from cdc_pipeline.config import PipelineConfig, SinkConfig, TableConfig
from cdc_pipeline.sinks import sink_class

TABLE_NAME = "dagster/table_name"


class CdcTranslator:
    def source_key(self, table: str) -> AssetKey:
        schema, _, name = table.partition(".")
        return AssetKey(["source", schema, name])

    def change_log_key(self) -> AssetKey:
        return AssetKey(["cdc", "change_log"])

    def snapshot_key(self, table: TableConfig) -> AssetKey:
        return AssetKey(["cdc", "snapshot", table.schema_name, table.table_name])

    def sink_key(self, sink_name: str) -> AssetKey:
        return AssetKey(["sink", sink_name])

    def source_spec(self, pipeline: PipelineConfig, table: str) -> AssetSpec:
        return AssetSpec(
            self.source_key(table), group_name="source", kinds={"postgres"},
            description=f"Source table {table}, captured through slot {pipeline.source.slot!r} "
                        f"(publication {pipeline.source.publication!r}).",
            metadata={TABLE_NAME: table},
        )

    def sink_metadata(self, sink: SinkConfig) -> dict[str, str]:
        """What the sink's type says of its asset (sinks/base.py), and `dagster/table_name` for a sink that
        writes one table."""
        cls = sink_class(sink)
        out = cls.asset_metadata(sink)
        tables = cls.destination_tables(sink)
        if len(tables) == 1:
            out[TABLE_NAME] = tables[0]
        return out


def source_tables(pipeline: PipelineConfig) -> list[str]:
    """Every table the pipeline reads: configured tables and those only named by sinks."""
    names = [t.qualified for t in pipeline.tables]
    for sink in pipeline.sinks:
        names += [t for t in sink.tables if t not in names]
    return names
