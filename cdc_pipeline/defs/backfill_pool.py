"""The Dagster pool every backfill step is in (dagster.yaml limits it; defs/capture.py's drain sensor makes
sure the limit exists before the first backfill is queued)."""

BACKFILL_POOL = "cdc_backfill"
