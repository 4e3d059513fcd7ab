"""Data versions that make Dagster's "Unsynced" say what a sink's lag says.

`cdc/change_log` is a stream: its data version names the stream (`STREAM_VERSION`), not a point in it
(the point is its `log_head` metadata). A sink's data version is its offset ('X/Y:idx': the commit LSN in
PostgreSQL's notation and the index within the commit, as all the UI's metadata shows positions).

Dagster calls an asset "Unsynced" when an upstream asset's current data version differs from the one
its latest materialization names as its input. Two runs record these (the drain run the log's, a delivery
run its sink's), so if the log's version were its head, each log materialization would leave every sink
"Unsynced" until the sink's own next one named it: seconds to a minute per minute, however well the sink
keeps up. With the log's version fixed, what a sink names decides alone: the log's version while the sink
keeps up (its lag within `delivery.max_lag_seconds`, what `lag_below_max` checks), its own offset while it
is behind (a version the log never has: "Unsynced"). A delivery run records a materialization as soon as
that changes (defs/pacing.py).

A streaming run records its materializations itself (AssetMaterialization events while it runs), and
Dagster adds no provenance to those: without it the UI would judge staleness by timestamps. So each
carries the provenance tags Dagster writes for a MaterializeResult (`dagster/data_version`,
`dagster/code_version`, and per upstream asset the version and event it was computed from).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dagster import AssetKey, DagsterInstance, DataVersion

from cdc_pipeline.core.positions import Position, parse_position, position_lsn_text

# Dagster's provenance tags (dagster._core.definitions.data_version; the names are stored in every
# instance's event log, so they are stable).
DATA_VERSION_TAG = "dagster/data_version"
USER_PROVIDED_TAG = "dagster/data_version_is_user_provided"
CODE_VERSION_TAG = "dagster/code_version"
INPUT_VERSION_PREFIX = "dagster/input_data_version/"
INPUT_POINTER_PREFIX = "dagster/input_event_pointer/"
NULL_POINTER = "NULL"
DEFAULT_VERSION = "INITIAL"  # what Dagster assumes of an upstream asset with no recorded version
STREAM_VERSION = DataVersion("stream")  # the change log's (see above)


def position_version(position: Position) -> DataVersion:
    return DataVersion(position_lsn_text(position))


def version_position(version: str | None) -> Position | None:
    """The position a version of ours names ('X/Y:idx', or 'commit_lsn:commit_idx' as versions recorded
    before were); None for a version that is not a position."""
    return parse_position(version or "")


@dataclass(frozen=True)
class Recorded:
    """An asset's latest materialization in the instance: its data version, event id and time."""

    version: str | None = None
    storage_id: int | None = None
    timestamp: float | None = None


def latest(instance: DagsterInstance, key: AssetKey, input_key: AssetKey | None = None) -> Recorded:
    """`key`'s latest materialization; with `input_key`, the version of it that one named as its input."""
    records = instance.fetch_materializations(key, limit=1).records
    if not records:
        return Recorded()
    record = records[0]
    materialization = record.asset_materialization
    tags = (materialization.tags or {}) if materialization is not None else {}
    version = tags.get(INPUT_VERSION_PREFIX + input_key.to_user_string()) if input_key else tags.get(DATA_VERSION_TAG)
    return Recorded(version, record.storage_id, record.timestamp)


def provenance_tags(version: DataVersion, code_version: str,
                    inputs: Mapping[AssetKey, tuple[str, int | None]]) -> dict[str, str]:
    """The tags of a materialization of `version`, computed from `inputs` (key: (version, event id))."""
    tags = {DATA_VERSION_TAG: version.value, USER_PROVIDED_TAG: "true", CODE_VERSION_TAG: code_version}
    for key, (input_version, storage_id) in inputs.items():
        tags[INPUT_VERSION_PREFIX + key.to_user_string()] = input_version
        tags[INPUT_POINTER_PREFIX + key.to_user_string()] = NULL_POINTER if storage_id is None else str(storage_id)
    return tags


def upstream_inputs(instance: DagsterInstance, keys: list[AssetKey]) -> dict[AssetKey, tuple[str, int | None]]:
    """Upstream assets as they are now: their latest version and event (sources never materialized here
    keep Dagster's default version, which is what Dagster compares them with)."""
    out = {}
    for key in keys:
        found = latest(instance, key)
        out[key] = (found.version or DEFAULT_VERSION, found.storage_id)
    return out
