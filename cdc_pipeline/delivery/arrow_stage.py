"""The stage for sinks that need nothing from Spark: no filter, transform, route or group columns.

Then a message is the log row's JSON with a metadata object around it: pure string assembly, which
Arrow's compute kernels do in C++ without shipping the batch to the JVM and back. The output is byte
for byte what the Spark stage produces (tested against it), so a sink can move between the two paths.
A typed read (a ``tup`` column, for a sink that takes typed rows) has an empty payload: its record
travels as its typed row.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from cdc_pipeline.delivery.plan import (
    METADATA_TAIL,
    SinkPlan,
    consumer_id,
    takes_texts,
    takes_truncate,
)


def _quoted(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """JSON string literals per value (null -> null); computed once per distinct value."""
    encoded = pc.dictionary_encode(column).combine_chunks() if isinstance(column, pa.ChunkedArray) \
        else pc.dictionary_encode(column)
    literals = pa.array([json.dumps(v, ensure_ascii=False) for v in encoded.dictionary.to_pylist()], pa.string())
    return pc.fill_null(pc.take(literals, encoded.indices), "null")


def _metadata_tail(batch: pa.Table) -> list[pa.Array]:
    """``,"annotations":{...}`` and ``,"enrichment":...`` where the row has them, else nothing
    (spark_stage._metadata_json)."""
    # A null value makes the joined element null, which becomes "".
    return [pc.fill_null(pc.binary_join_element_wise(f',"{name}":', batch.column(name), ""), "")
            for name in METADATA_TAIL if name in batch.column_names]


def _payloads(sink_name: str, batch: pa.Table, texts: bool = False) -> pa.Array:
    """Each row's message JSON (the Spark stage's bytes)."""
    lsn = pc.cast(batch.column("commit_lsn"), pa.string())
    idx = pc.cast(batch.column("commit_idx"), pa.string())
    stamp = pc.strftime(batch.column("commit_ts"), format="%Y-%m-%dT%H:%M:%S")
    key = pc.binary_join_element_wise(lsn, idx, ":")
    consumer = json.dumps({"id": consumer_id(sink_name), "name": sink_name}, ensure_ascii=False,
                          separators=(",", ":"))
    parts = [
        '{"record":', pc.fill_null(batch.column("record"), "null"),
        ',"changes":', pc.fill_null(batch.column("changes"), "null"),
        ',"action":"', batch.column("action"),
        '","metadata":{"table_schema":', _quoted(batch.column("table_schema")),
        ',"table_name":', _quoted(batch.column("table_name")),
        ',"commit_timestamp":"', stamp,
        'Z","commit_lsn":', lsn, ',"commit_idx":', idx,
        ',"idempotency_key":"', key, '","consumer":', consumer,
        ',"backfill_id":', _quoted(batch.column("backfill_id")), *_metadata_tail(batch), "}",
        *([',"texts":', pc.fill_null(batch.column("texts"), "null")] if texts else []), "}",
    ]
    n = batch.num_rows
    return pc.binary_join_element_wise(*[pa.array([p] * n, pa.string()) if isinstance(p, str) else p for p in parts],
                                       "")


def run_arrow_stage(plan: SinkPlan, batch: pa.Table) -> pa.Table:
    sink = plan.sink
    # A mirror also acts on a table's truncates and schema changes (capture/schema_changes.py).
    allowed = [*sink.actions, "read", *(["truncate", "schema"] if takes_truncate(sink) else [])]
    batch = batch.filter(pc.is_in(batch.column("action"), pa.array(allowed)))
    n = batch.num_rows
    typed = pc.is_valid(batch.column("tup")) if "tup" in batch.column_names else None
    typed_count = batch.num_rows - batch.column("tup").null_count if typed is not None else 0
    if typed is not None and typed_count == n:  # typed reads only: the sink reads their typed rows
        payload = pa.repeat("", n)
    else:
        payload = _payloads(sink.name, batch, takes_texts(sink) and "texts" in batch.column_names)
        if typed is not None and typed_count:
            payload = pc.if_else(typed, "", payload)
    if sink.message_grouping:
        group = pc.binary_join_element_wise(batch.column("table_schema"), batch.column("table_name"),
                                            batch.column("pk"), "|", null_handling="skip")
    else:
        group = pa.nulls(n, pa.string())
    out = {
        "commit_lsn": batch.column("commit_lsn"), "commit_idx": batch.column("commit_idx"),
        "group_key": group, "route": pa.nulls(n, pa.string()), "payload": payload,
    }
    if "tup" in batch.column_names:  # typed reads (state/typed_rows.py) for a sink that writes them as they are
        out.update({c: batch.column(c) for c in ("tup", "table_schema", "table_name", "backfill_id")})
    return pa.table(out)
