"""The message format, shown by running the delivery stage itself (the Arrow stage, byte for byte the Spark
stage's output) over a few example log rows: the examples are what a sink receives, never hand-written."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from cdc_pipeline.config import parse_config
from cdc_pipeline.delivery import rows
from cdc_pipeline.delivery.arrow_stage import run_arrow_stage
from cdc_pipeline.delivery.plan import SinkPlan

_CONFIG = """\
source: {dsn: "postgresql://app@db.example/app"}
tables: [{name: public.orders}]
sinks:
  - {name: orders_hook, tables: [public.orders], destination: {type: webhook, url: "https://hooks.example/cdc"}}
"""
_AT = datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC)
_BACKFILL = "0b7c6c1e-5d1a-4f0e-9a57-3f4b1c2d9e10"
# (commit_lsn, commit_idx, action, record, changes, backfill_id): one of each kind of change
_LOG = [
    (24681000, 0, "insert", {"id": 1, "status": "new", "amount": 120.5}, None, None),
    (24681234, 0, "update", {"id": 1, "status": "paid", "amount": 120.5}, {"status": "new"}, None),
    (24681500, 0, "delete", {"id": 1, "status": "paid", "amount": 120.5}, None, None),
    (24681600, 3, "read", {"id": 2, "status": "new", "amount": 7}, None, _BACKFILL),
]

INTRO = """\
# Message format

Every sink receives JSON messages of one shape, compatible with Sequin's. The examples on this page are
produced by running the delivery stage on example change-log rows (`python -m cdc_pipeline.reference`), so
they are exactly what a sink with no transform receives (the stage writes them without spaces; they are
indented here). See [Values](../explanation/values.md) for how each PostgreSQL type appears in `record`.

| field | meaning |
|---|---|
| `record` | the new row (the old row for a `delete`), as `to_jsonb(row)` prints it (generated columns: per PostgreSQL version, see [Values](../explanation/values.md)); a `delete` under the default replica identity carries only the key: see below |
| `changes` | the old values of the columns an `update` changed; `null` otherwise. Old values need `REPLICA IDENTITY FULL`; with the default identity only a changed key's old values are known, and `changes` is `{}` otherwise |
| `action` | `insert`, `update`, `delete`, or `read` (a backfill's row) |
| `metadata.table_schema`, `metadata.table_name` | the source table |
| `metadata.commit_timestamp` | the source transaction's commit time, UTC |
| `metadata.commit_lsn`, `metadata.commit_idx` | the message's position in the change log: commit order |
| `metadata.idempotency_key` | `commit_lsn:commit_idx`: the same on every redelivery |
| `metadata.consumer` | the sink: `id` (a UUID 5 of its name) and `name` |
| `metadata.backfill_id` | the backfill a `read` came from; `null` for changes |
| `metadata.annotations` | the transaction's annotation, where it has one ([Capture](../explanation/capture.md#transaction-annotations)) |
| `metadata.enrichment` | the enrichment's columns, where the sink has one; the last key of `metadata` (after `annotations`) |

A `delete` under the default replica identity (`REPLICA IDENTITY DEFAULT`, or `USING INDEX`) carries the
old row's key columns only: its `record` has the key's values and every other column JSON `null`, which a
consumer cannot tell from columns that really were NULL (nothing marks them). With `REPLICA IDENTITY FULL`
the whole old row is carried.

A column whose value was an unchanged TOAST value under the default replica identity is left out of
`record` (the WAL does not carry it). A change is keyed by the primary key its table had when the change
was made. The idempotency key also travels as the webhook `Idempotency-Key` header, NATS `Nats-Msg-Id`,
RabbitMQ `message_id` and the Redis `key` field.

"""


def _log_batch():  # noqa: ANN202 - a pyarrow Table; pyarrow is imported lazily like everywhere else
    import pyarrow as pa

    def column(i: int) -> list[object]:
        return [row[i] for row in _LOG]

    return pa.table({
        "commit_lsn": pa.array(column(0), pa.int64()),
        "commit_idx": pa.array(column(1), pa.int32()),
        "table_schema": pa.array(["public"] * len(_LOG)),
        "table_name": pa.array(["orders"] * len(_LOG)),
        "action": pa.array(column(2)),
        "pk": pa.array([json.dumps([r[3]["id"]]) for r in _LOG]),
        "record": pa.array([json.dumps(r, separators=(",", ":")) for r in column(3)]),
        "changes": pa.array([None if c is None else json.dumps(c, separators=(",", ":")) for c in column(4)],
                            pa.string()),
        "commit_ts": pa.array([_AT] * len(_LOG), pa.timestamp("us", tz="UTC")),
        "backfill_id": pa.array(column(5), pa.string()),
    })


def _show(payload: str) -> str:
    return "```json\n" + json.dumps(json.loads(payload), indent=2, ensure_ascii=False) + "\n```\n"


def render() -> str:
    config = parse_config(_CONFIG, "example.yaml", environ={})
    out = run_arrow_stage(SinkPlan.build(config, config.sink("orders_hook")), _log_batch())
    payloads = out.column("payload").to_pylist()
    parts = [INTRO, "## Changes (`stream: changes`, the default)\n\n"]
    for (_, _, action, *_rest), payload in zip(_LOG, payloads, strict=True):
        parts += [f"### `{action}`\n\n", _show(payload), "\n"]
    parts += ["As the sink receives it (the `update`):\n\n", f"```\n{payloads[1]}\n```\n\n"]
    deleted = {(24681500, 0): '{"id":1}'}
    shaped = rows.reshape(out, deleted).column("payload").to_pylist()
    parts += ["## Rows (`stream: rows`)\n\n",
              "The latest version of each changed row: no `action`, no `changes`; several changes of a row in "
              "one batch are coalesced into the last (carrying every column they set). A deleted row is sent "
              "only with `deletes: true`, as its key with `\"deleted\": true`; truncates are not sent.\n\n",
              "### A row\n\n", _show(shaped[1]), "\n### A deleted row (`deletes: true`)\n\n", _show(shaped[2]),
              "\n## Envelopes\n\n",
              "- **webhook**: `POST {\"data\": [message, ...]}`, `Content-Type: application/json`.\n",
              "- **http_pull**: `receive` answers `{\"data\": [{\"ack_id\": \"1234.1\", \"message\": {...}}, ...]}`.\n",
              "- **redis_stream**: `XADD <stream> * key <idempotency key> data <message>`.\n",
              "- **nats**, **rabbitmq**: the message is the body.\n",
              "- **parquet**: columns `idempotency_key, commit_lsn, commit_idx, action, message` (the JSON).\n",
              "- **postgres** `append`: one row per message (`idempotency_key` primary key, position, table, action, "
              "the whole message as `jsonb`); `mirror` applies the message to a table instead.\n",
              "\nA sink with a `transform` receives the fields the transform computes instead of `record`, "
              "`changes` and `action` (see [Filters, transforms, routes](../explanation/delivery.md)).\n"]
    return "".join(parts)
