"""Row-stream reshaping (delivery/rows.py) on hand-built batches: coalescing and the message shape."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa

from cdc_pipeline.delivery import rows
from cdc_pipeline.state.change_log import LOG_ARROW_SCHEMA


def log_batch(entries: list[tuple[str, str | None, str | None]]) -> pa.Table:
    """(action, pk, record) per log row, positions 1.., table public.t."""
    n = len(entries)
    return pa.table({
        "commit_lsn": list(range(1, n + 1)), "commit_idx": [0] * n, "xid": [1] * n,
        "table_schema": ["public"] * n, "table_name": ["t"] * n, "action": [e[0] for e in entries],
        "pk": [e[1] for e in entries], "record": [e[2] for e in entries], "changes": ['{"v": 0}'] * n,
        "commit_ts": [datetime(2026, 1, 1, tzinfo=UTC)] * n, "backfill_id": [None] * n, "texts": [None] * n,
        "annotations": [None] * n,
    }, schema=LOG_ARROW_SCHEMA)


def test_coalesce_keeps_each_rows_last_entry_in_log_order():
    batch = log_batch([("insert", "[1]", '{"id":1,"v":1}'), ("insert", "[2]", '{"id":2}'),
                       ("update", "[1]", '{"id":1,"v":2}'), ("delete", "[2]", '{"id":2}'),
                       ("insert", None, '{"v":"keyless"}'), ("read", "[3]", '{"id":3}'),
                       ("truncate", None, None)])
    out = rows.coalesce(batch, deletes=False)
    assert out.column("commit_lsn").to_pylist() == [3, 5, 6]  # 2's last entry is a delete: dropped
    assert out.column("changes").null_count == 3
    out = rows.coalesce(batch, deletes=True)
    assert out.column("commit_lsn").to_pylist() == [3, 4, 5, 6]
    assert rows.deleted_keys(out, lambda table: ["id"]) == {(4, 0): '{"id":2}'}


def test_row_message_shape_is_robust_to_look_alike_columns_and_keeps_digits():
    # A table whose own columns are named like the envelope's fields.
    record = '{"changes":null,"action":"x","metadata":1}'
    text = '{"record":' + record + ',"changes":null,"action":"update","metadata":{"commit_lsn":5}}'
    assert rows._row_message(text, None) == '{"record":' + record + ',"metadata":{"commit_lsn":5}}'
    assert rows._row_message(text, '{"id":7}') == '{"record":{"id":7},"deleted":true,"metadata":{"commit_lsn":5}}'
    # A transform's own shape goes through a JSON parse that keeps numbers digit for digit.
    shaped = '{"total":12345678901234567890.123456789,"action":"update","id":1}'
    assert rows._row_message(shaped, None) == '{"total":12345678901234567890.123456789,"id":1}'
    assert json.loads(rows._row_message(shaped, '{"id":1}')) == {
        "record": {"id": 1}, "deleted": True, "total": 12345678901234567890.123456789, "id": 1}


def test_coalesce_carries_columns_a_dropped_update_set():
    """`big` is absent from the later updates (an unchanged TOAST value): the kept one takes it over
    from the dropped update that set it, but not across a delete."""
    batch = log_batch([("insert", "[1]", '{"id":1,"v":1,"big":"old"}'), ("update", "[1]", '{"id":1,"v":2,"big":"new"}'),
                       ("update", "[1]", '{"id":1,"v":3}'), ("update", "[2]", '{"id":2,"v":1,"big":"x"}'),
                       ("delete", "[2]", '{"id":2}'), ("insert", "[2]", '{"id":2,"v":5,"big":"y"}'),
                       ("update", "[2]", '{"id":2,"v":6}'), ("update", "[3]", '{"id":3,"n":1.50}'),
                       ("update", "[3]", '{"id":3,"v":1}')])
    out = rows.coalesce(batch, deletes=False)
    got = [json.loads(r) for r in out.column("record").to_pylist()]
    assert got == [{"id": 1, "v": 3, "big": "new"}, {"id": 2, "v": 6, "big": "y"}, {"id": 3, "n": 1.50, "v": 1}]
    assert '"n":1.50' in out.column("record")[2].as_py()  # digits kept
