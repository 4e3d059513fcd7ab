"""Test helpers: build configs, run the pipeline's real code paths, compare source and mirror."""

from __future__ import annotations

from typing import Any

import psycopg

from cdc_pipeline.capture.drain import Drain, DrainStats
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.delivery.engine import Deliverer, DeliveryStats


def mirror_config(source_dsn: str, dest_dsn: str, tables: list[str | dict[str, Any]],
                  target: str = "mirror.{table}", **sink: Any) -> dict[str, Any]:
    table_entries = [t if isinstance(t, dict) else {"name": t} for t in tables]
    names = [t["name"] for t in table_entries]
    return {
        "source": {"dsn": source_dsn, "slot": "cdc_test", "publication": "cdc_test"},
        "spark": {"master": "local[2]"},
        "drain": {"heartbeat_seconds": 1, "batch_ms": 200},
        "tables": table_entries,
        "sinks": [{"name": "mirror", "tables": names,
                   "destination": {"type": "postgres", "dsn": dest_dsn, "table": target, "mode": "mirror"},
                   **sink}],
    }


def drain(config: PipelineConfig) -> DrainStats:
    return Drain(config).run(until_idle=True, seconds=300)


def deliver(config: PipelineConfig, spark: Any, sink: str = "mirror", **kw: Any) -> DeliveryStats:
    return Deliverer(config, config.sink(sink), spark, **kw).run(until_idle=True)


def sync(config: PipelineConfig, spark: Any) -> DeliveryStats:
    d = drain(config)
    print("drain", d)
    stats = deliver(config, spark)
    print("deliver", stats)
    with psycopg.connect(config.state_dsn) as conn:
        print(conn.execute("SELECT last_error FROM cdc_pipeline.failed_messages").fetchall())
    return stats


def rows(dsn: str, table: str, order: str = "1") -> list[Any]:
    schema, _, name = table.partition(".")
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute(
            psycopg.sql.SQL("SELECT to_jsonb(t) FROM {} t ORDER BY {}").format(
                psycopg.sql.Identifier(schema, name), psycopg.sql.SQL(order))).fetchall()]


def assert_mirrored(source_dsn: str, source_table: str, dest_dsn: str, dest_table: str, order: str = "1") -> int:
    src = rows(source_dsn, source_table, order)
    dst = rows(dest_dsn, dest_table, order)
    assert len(dst) == len(src), f"{dest_table}: {len(dst)} rows, source has {len(src)}"
    for a, b in zip(src, dst, strict=True):
        assert a == b, f"row differs:\nsource {a}\nmirror {b}"
    return len(src)
