"""The logical-message prefixes the pipeline itself reads. Anyone who can write to the source can emit a
message under any of them: the drain acts only on content that is its own (capture/drain.py)."""

from __future__ import annotations

from cdc_pipeline.backfill.watermark import WATERMARK_PREFIX
from cdc_pipeline.capture.annotations import ANNOTATIONS_PREFIX

HEARTBEAT_PREFIX = "cdc_pipeline.heartbeat"
PROBE_PREFIX = "cdc_pipeline.probe"
DDL_PREFIX = "cdc_pipeline.ddl"  # schema changes from the source's event trigger (admin/ddl_capture.py)
OWN_PREFIXES = (HEARTBEAT_PREFIX, PROBE_PREFIX, ANNOTATIONS_PREFIX, WATERMARK_PREFIX, DDL_PREFIX)
