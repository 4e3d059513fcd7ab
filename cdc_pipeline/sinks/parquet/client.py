"""Parquet sink: Spark writes each batch under `path`, partitioned by table, commit date and batch.

The batch partition is named after the batch's first position, and the write replaces exactly the
partitions it touches (dynamic partition overwrite): a batch retried after a crash starts at the same
position, so it replaces its own earlier files instead of adding duplicates. `path` may be any Hadoop
filesystem URI Spark can write (file://, hdfs://, s3a://, ...).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql import SparkSession

from cdc_pipeline.sinks.base import OutboundMessage, Sink, SinkUnavailable


class ParquetSink(Sink):
    def __init__(self, sink_config: object) -> None:
        self.name = sink_config.name  # type: ignore[attr-defined]
        self.path: str = sink_config.destination.path  # type: ignore[attr-defined]

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        if not batch:
            return []
        lsns, idxs, tables, dates, actions, bodies = [], [], [], [], [], []
        for m in batch:
            lsn, _, idx = m.key.partition(":")
            body = json.loads(m.payload)
            meta = body.get("metadata") if isinstance(body, dict) else None
            meta = meta if isinstance(meta, dict) else {}
            lsns.append(int(lsn))
            idxs.append(int(idx))
            tables.append(m.route or f"{meta.get('table_schema', 'unknown')}.{meta.get('table_name', 'unknown')}")
            stamp = str(meta.get("commit_timestamp") or datetime.now(UTC).isoformat())
            dates.append(stamp[:10])
            actions.append(body.get("action") if isinstance(body, dict) else None)
            bodies.append(m.payload.decode())
        first = f"{lsns[0]}_{idxs[0]}"
        table = pa.table({
            "idempotency_key": [m.key for m in batch], "commit_lsn": pa.array(lsns, pa.int64()),
            "commit_idx": pa.array(idxs, pa.int32()), "action": actions, "message": bodies,
            "table": tables, "date": dates, "batch": [first] * len(batch),
        })
        # The deliverer's session (started on first use: delivery/lazy_spark.py), configured from cdc.yaml.
        spark = self.context.spark if self.context.spark is not None else SparkSession.builder.getOrCreate()
        try:
            (spark.createDataFrame(table).write.mode("overwrite")
             .option("partitionOverwriteMode", "dynamic")
             .partitionBy("table", "date", "batch").parquet(self.path))
        except Exception as exc:  # the filesystem refused: retry the batch later
            first_line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise SinkUnavailable(f"parquet sink {self.name!r}: write failed: {first_line}") from exc
        return [None] * len(batch)
