"""http_pull sink: messages are queued in the state database for `cdc-pipeline serve` to hand out.

"Delivering" is inserting into `pull_queue` on the delivery engine's own state connection, inside the
transaction that then advances the sink's offset: the batch and the offset commit together, so a crash
neither loses nor duplicates messages. Consumers receive, ack and nack over HTTP (consumers/app.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from cdc_pipeline.postgres import catalog
from cdc_pipeline.sinks.base import OutboundMessage, Sink, SinkConfigLike
from cdc_pipeline.state.pull_queue import PullQueue


class HttpPullSink(Sink):
    def __init__(self, sink_config: SinkConfigLike) -> None:
        self.name = sink_config.name

    @classmethod
    def status(cls, sink_config: SinkConfigLike, conn: psycopg.Connection, schema: str) -> dict[str, Any]:
        """The queue's counts, once `serve` or a delivery has made it."""
        if not catalog.table_exists(conn, schema, "pull_queue"):
            return {}
        return {"pull_queue": PullQueue(schema).counts(conn, sink_config.name)}

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        conn = self.context.state  # the delivery's: its transaction commits the offset (sinks/base.py SinkContext)
        if conn is None:
            raise RuntimeError(f"http_pull sink {self.name!r}: no state connection in its context")
        rows = []
        for m in batch:
            lsn, _, idx = m.key.partition(":")
            rows.append((int(lsn), int(idx), m.group, m.payload.decode()))
        PullQueue(self.context.schema).enqueue(conn, self.name, rows)
        return [None] * len(batch)
