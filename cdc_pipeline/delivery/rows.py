"""Row streams (`stream: rows`): the latest version of each changed row instead of each change.

Applied around the stage, so it works for every sink type: before it, a log batch is coalesced to the
last entry of each row (table + primary key) and deletes are dropped unless the sink wants them (and
truncates always: a row stream has no such message); after it, each message loses `action` and
`changes`, and a delete becomes `{"record": <old key>, "deleted": true, "metadata": ...}`. Backfill
reads (`read`) are rows already and go through the same path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc

from cdc_pipeline.core.positions import Position

# 'schema.table' -> its primary key columns, in key order
KeyColumns = Callable[[str], Sequence[str]]


def coalesce(batch: pa.Table, deletes: bool) -> pa.Table:
    """The last log entry of each row in the batch, in log order, with `changes` emptied; rows without a
    key stay as they are. A kept update carries the columns the row's dropped entries set that it lacks
    (unchanged TOAST values, `_carry_dropped`)."""
    if batch.num_rows == 0:
        return batch
    row_key = pc.binary_join_element_wise(batch.column("table_schema"), batch.column("table_name"),
                                          batch.column("pk"), "|", null_handling="emit_null")
    indexed = pa.table({"k": row_key, "i": pa.array(range(batch.num_rows), pa.int64())})
    keyed = indexed.filter(pc.is_valid(indexed.column("k")))
    groups = keyed.group_by("k").aggregate([("i", "max"), ("i", "count")])
    last = groups.column("i_max").combine_chunks()
    unkeyed = indexed.filter(pc.is_null(indexed.column("k"))).column("i").combine_chunks()
    keep = pa.concat_arrays([last.cast(pa.int64()), unkeyed.cast(pa.int64())])
    several = groups.filter(pc.greater(groups.column("i_count"), 1)).column("k")
    if len(several):
        batch = _carry_dropped(batch, keyed.filter(pc.is_in(keyed.column("k"), several.combine_chunks())))
    out = batch.take(pc.take(keep, pc.sort_indices(keep)))
    actions = ["insert", "update", "read", *(["delete"] if deletes else [])]
    out = out.filter(pc.is_in(out.column("action"), pa.array(actions)))
    return out.set_column(out.schema.get_field_index("changes"), "changes", pa.nulls(out.num_rows, pa.string()))


def _carry_dropped(batch: pa.Table, entries: pa.Table) -> pa.Table:
    """An update's record lacks the columns it left unchanged when they are TOASTed. When coalescing
    drops earlier entries of the row, the kept update takes over the columns they carried (since the
    row's last insert, read or delete), so a value set by a dropped update is not lost."""
    actions, records = batch.column("action"), batch.column("record")
    carried: dict[object, dict[str, object] | None] = {}
    replaced: dict[int, str] = {}
    for key, i in zip(entries.column("k").to_pylist(), entries.column("i").to_pylist(), strict=True):
        action, text = actions[i].as_py(), records[i].as_py()
        if action == "delete" or text is None:
            carried[key] = None if action == "delete" else {}
            continue
        record = _loads(text)
        if not isinstance(record, dict):
            continue
        before = carried.get(key)
        if action == "update" and before and not before.keys() <= record.keys():
            record = {**before, **record}
            replaced[i] = _json(record)
        carried[key] = record
    if not replaced:
        return batch
    values = records.to_pylist()
    for i, text in replaced.items():
        values[i] = text
    return batch.set_column(batch.schema.get_field_index("record"), "record", pa.array(values, pa.string()))


def _json(value: object) -> str:
    # Numbers were parsed as Decimal so they go out digit for digit.
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, list):
        return "[" + ",".join(map(_json, value)) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _json(v) for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def _loads(text: str) -> object:
    return json.loads(text, parse_float=Decimal)


def deleted_keys(batch: pa.Table, key_columns: KeyColumns) -> dict[Position, str]:
    """The old key of each delete in a (coalesced) batch, as a JSON object."""
    out: dict[Position, str] = {}
    deletes = batch.filter(pc.equal(batch.column("action"), "delete"))
    for row in deletes.select(["commit_lsn", "commit_idx", "table_schema", "table_name", "pk", "record"]).to_pylist():
        names = list(key_columns(f"{row['table_schema']}.{row['table_name']}"))
        values = _loads(row["pk"]) if row["pk"] else None
        if names and isinstance(values, list) and len(values) == len(names):
            key = _json(dict(zip(names, values, strict=True)))
        else:  # no known key: the old row as the log holds it
            key = row["record"] or "{}"
        out[(row["commit_lsn"], row["commit_idx"])] = key
    return out


ENVELOPE = ',"changes":null,"action":"'  # how the stages write a message's own fields after `record`


def _row_message(text: str, deleted_key: str | None) -> str:
    # The stage's shape is {"record":R,"changes":null,"action":"A","metadata":M}. Inside R that exact
    # sequence can only be keys of R itself, which come before the envelope's, hence the last one.
    at = text.rfind(ENVELOPE)
    end = text.find('"', at + len(ENVELOPE)) + 1 if at >= 0 else -1
    if at >= 0 and text.startswith('{"record":') and text.startswith(',"metadata":', end):
        if deleted_key is None:
            return text[:at] + text[end:]
        return '{"record":' + deleted_key + ',"deleted":true' + text[end:]
    message = _loads(text)  # a transform's own shape: drop the change fields it kept
    if not isinstance(message, dict):
        return text
    message.pop("action", None)
    message.pop("changes", None)
    if deleted_key is not None:
        message = {"record": _loads(deleted_key), "deleted": True, **{k: v for k, v in message.items() if k != "record"}}
    return _json(message)


def reshape(out: pa.Table, deleted: dict[Position, str]) -> pa.Table:
    """Stage output (change shape) -> row shape."""
    if out.num_rows == 0:
        return out
    lsns, idxs = out.column("commit_lsn").to_pylist(), out.column("commit_idx").to_pylist()
    payloads = [_row_message(text, deleted.get((lsn, idx)))
                for lsn, idx, text in zip(lsns, idxs, out.column("payload").to_pylist(), strict=True)]
    return out.set_column(out.schema.get_field_index("payload"), "payload", pa.array(payloads, pa.string()))
