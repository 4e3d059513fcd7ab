"""From the pipeline's config to Dagster asset specs, in one place (the translator of dagster-dlt and
dagster-sling): `CdcTranslator.get_asset_spec(data)` is the one override point for every asset's key,
group, description, kinds, metadata, tags and owners. Subclass it and pass it to `build_definitions`
to rename keys, regroup assets or add metadata; the YAML component's `translation` is applied there too.

Keys name data, not actions: ``source/<schema>/<table>`` (the source tables, not materialized here),
``cdc/change_log`` (the ordered log the drain writes), ``cdc/snapshot/<schema>/<table>_snapshot`` (a table's
backfill: its rows as read messages in the log), ``sink/<name>`` (what a sink holds) and
``api_sync/<source>/<collection>``. A spec's deps are its upstream assets' keys, asked of
`self.get_asset_spec` in turn, so a subclass that renames keys keeps the lineage connected.
"""

from __future__ import annotations

from typing import Any

from dagster import AssetKey, AssetSpec

from cdc_pipeline.config import PipelineConfig, SinkConfig
from cdc_pipeline.defs.asset_data import (
    ApiCollectionData,
    AssetData,
    ChangeLogData,
    SinkData,
    SnapshotData,
    SourceTableData,
)
from cdc_pipeline.defs.tags import API_SYNC_TAGS, BACKFILL_TAGS, DELIVERY_TAGS, DRAIN_TAGS, TABLE_NAME
from cdc_pipeline.sinks import sink_class

# A snapshot asset's `backfill` metadata: what its "Never materialized" / "Missing (N)" means.
SNAPSHOT_ON_DEMAND = ("on demand: the table's changes stream through cdc/change_log; a materialization is a "
                      "backfill someone asked for, and a missing one is no work left to do")


class CdcTranslator:
    def get_asset_spec(self, data: AssetData) -> AssetSpec:
        if isinstance(data, SourceTableData):
            return self._source_table(data)
        if isinstance(data, ChangeLogData):
            return self._change_log(data)
        if isinstance(data, SnapshotData):
            return self._snapshot(data)
        if isinstance(data, SinkData):
            return self._sink(data)
        if isinstance(data, ApiCollectionData):
            return self._api_collection(data)
        raise TypeError(f"no asset spec for {type(data).__name__}")

    def _source_table(self, data: SourceTableData) -> AssetSpec:
        source = data.pipeline.source
        return AssetSpec(
            AssetKey(["source", data.schema_name, data.table_name]), group_name="source", kinds={"postgres"},
            description=f"Source table {data.table}, captured through slot {source.slot!r} "
                        f"(publication {source.publication!r}).",
            metadata={TABLE_NAME: data.table},
        )

    def _change_log(self, data: ChangeLogData) -> AssetSpec:
        sources = [self.get_asset_spec(SourceTableData(data.pipeline, t)).key for t in source_tables(data.pipeline)]
        return AssetSpec(
            AssetKey(["cdc", "change_log"]), deps=sources, group_name="cdc", kinds={"postgres"}, tags=DRAIN_TAGS,
            metadata={TABLE_NAME: f"{data.pipeline.state.schema_name}.change_log"},  # in the state database
            description="Ordered change log in the state database: the drain streams the replication slot "
                        "into it and acknowledges the slot after each commit. The cdc_drain_sensor keeps one "
                        "long-lived cdc_drain run streaming; Materialize ends at once while it streams (else "
                        "catches up, at most a minute).",
        )

    def _snapshot(self, data: SnapshotData) -> AssetSpec:
        # "Never materialized" / "Missing (N)" on this asset means no backfill was asked (see the description).
        table = data.table
        what = (f"windows of {table.sort_column} ({table.partitions.kind} partitions)" if table.partitions
                else "the whole table, by primary key")
        return AssetSpec(
            AssetKey(["cdc", "snapshot", table.schema_name, f"{table.table_name}_snapshot"]),
            deps=[self.get_asset_spec(SourceTableData(data.pipeline, table.qualified)).key],
            group_name="cdc", kinds={"postgres"}, tags=BACKFILL_TAGS,
            description=f"On demand: a backfill of {table.qualified} to its sinks as read messages ({what}). "
                        "The table's changes reach the sinks through the change log without it, so "
                        + ("a missing partition is a day nobody asked to read again" if table.partitions else
                           "'Never materialized' means nobody asked to read it again")
                        + ", not work left to do. Runs alongside the drain without stale reads; resumes from "
                        "its checkpoint after a failure.",
            metadata={"backfill": SNAPSHOT_ON_DEMAND},
        )

    def _sink(self, data: SinkData) -> AssetSpec:
        sink, pipeline = data.sink, data.pipeline
        configured = {t.qualified: t for t in pipeline.tables}  # a backfill needs a configured table
        snapshots = [self.get_asset_spec(SnapshotData(pipeline, configured[t])).key for t in sink.tables
                     if t in configured]
        return AssetSpec(
            AssetKey(["sink", sink.name]), deps=[self.get_asset_spec(ChangeLogData(pipeline)).key, *snapshots],
            group_name="sink", metadata=sink_metadata(sink), kinds={"spark", sink.destination.type},
            tags=DELIVERY_TAGS,
            description=f"What sink {sink.name} ({sink.destination.type}) holds: the change log of "
                        f"{', '.join(sink.tables)} through its filter and transform. The cdc_delivery_sensor keeps "
                        "a long-lived delivery run alive while it lags; Materialize ends at once while one runs "
                        "(else catches up, at most a minute).",
        )

    def _api_collection(self, data: ApiCollectionData) -> AssetSpec:
        source, coll = data.source, data.collection
        return AssetSpec(
            AssetKey(["api_sync", source.name, coll.name.strip("/").replace("/", "_")]), group_name="api_sync",
            kinds={source.type if source.type != "rest" else "api", "postgres"}, tags=API_SYNC_TAGS,
            description=f"{source.type} API collection {coll.name} of source {source.name} -> {coll.table}: "
                        "backfill of all history (resumes from its checkpoint), then changes since the cursor.",
        )


def sink_metadata(sink: SinkConfig) -> dict[str, str]:
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


def asset_args(spec: AssetSpec) -> dict[str, Any]:
    """The `@asset` arguments that make an asset of `spec` (kinds travel in its tags). Partitions come
    from the table's config, not from the spec."""
    return {"key": spec.key, "deps": spec.deps, "group_name": spec.group_name, "description": spec.description,
            "metadata": spec.metadata, "tags": spec.tags, "owners": spec.owners, "code_version": spec.code_version,
            "automation_condition": spec.automation_condition, "freshness_policy": spec.freshness_policy}
