"""Data versions that mean something: `cdc/change_log`'s is the log's head position, a sink's its offset
(both 'X/Y:idx': the commit LSN in PostgreSQL's notation and the index within the commit, as all the UI's
metadata shows positions), so a caught-up sink's version equals the log's.

A streaming run records its materializations itself (AssetMaterialization events while it runs), and
Dagster adds no provenance to those: without it the UI would judge staleness by timestamps and call a
sink "Unsynced" whenever the log was materialized after it. So each materialization carries the
provenance tags Dagster writes for a MaterializeResult (`dagster/data_version`, `dagster/code_version`,
and per upstream asset the version and event it was computed from). A sink names as its change-log
input the log's latest recorded version when the sink has delivered up to it, and otherwise its own
offset (a version the log no longer has: the sink reads "Unsynced", as its lag says).
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


def latest(instance: DagsterInstance, key: AssetKey) -> Recorded:
    records = instance.fetch_materializations(key, limit=1).records
    if not records:
        return Recorded()
    record = records[0]
    materialization = record.asset_materialization
    tags = (materialization.tags or {}) if materialization is not None else {}
    return Recorded(tags.get(DATA_VERSION_TAG), record.storage_id, record.timestamp)


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
