"""Every Dagster tag (and `dagster/` metadata key) the pipeline writes or reads, in one place.

`dagster.yaml`'s tag concurrency limits read `KIND_TAG` (drain, backfill) and `SINK_TAG`: renaming
one here means changing it there too.
"""

from __future__ import annotations

KIND_TAG = "cdc_pipeline/kind"  # what a run (or asset) does: one of the kinds below
SINK_TAG = "cdc_pipeline/sink"  # a delivery run's sink (or lane, `S#I/N`): at most two runs each (a handover)
BACKFILL_ID_TAG = "cdc_pipeline/backfill_id"  # a backfill run: the pipeline's id of the backfill it runs (bf_...)
AFTER_TAG = "cdc_pipeline/after"  # a successor run: the id of the run it takes over from
HANDOVER_TAG = "cdc_pipeline/handover"  # a streaming run asks its sensor for a successor now (why: the value)

DRAIN = "drain"
DELIVERY = "delivery"
BACKFILL = "backfill"
REPLAY = "replay"
API_SYNC = "api_sync"

DRAIN_TAGS = {KIND_TAG: DRAIN}  # dagster.yaml: at most two drain runs (one streams, one taking over)
BACKFILL_TAGS = {KIND_TAG: BACKFILL}  # dagster.yaml: at most two backfill runs at a time
DELIVERY_TAGS = {KIND_TAG: DELIVERY}
REPLAY_TAGS = {KIND_TAG: REPLAY}
API_SYNC_TAGS = {KIND_TAG: API_SYNC}

# Dagster's own tags and metadata keys.
MAX_RETRIES_TAG = "dagster/max_retries"
SENSOR_NAME_TAG = "dagster/sensor_name"  # set by Dagster on a run a sensor requested
DAGSTER_BACKFILL_TAG = "dagster/backfill"  # set by Dagster on the runs of a backfill (its id)
TABLE_NAME = "dagster/table_name"  # asset metadata: the table an asset is
ROW_COUNT = "dagster/row_count"  # materialization metadata: rows in the asset (the UI shows it)
COLUMN_SCHEMA = "dagster/column_schema"  # asset metadata: the table's columns (TableSchema)

# Dagster's run retries (dagster.yaml) are for backfills; a streaming run that failed is restarted by its
# sensor (with backoff), and a retry beside that restart would be a second drain or delivery.
NO_RUN_RETRIES = {MAX_RETRIES_TAG: "0"}


def delivery_run_tags(sink_name: str) -> dict[str, str]:
    """The tags of a delivery run of one sink (the sensor's requests and the job's own tags)."""
    return {SINK_TAG: sink_name, **DELIVERY_TAGS}
