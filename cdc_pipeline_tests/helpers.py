"""Test helpers: build configs, run the pipeline's real code paths, compare source and mirror."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_pipeline.backfill.reader import PageReader, emit
from cdc_pipeline.backfill.request import BackfillRequest, resolve, table_shape
from cdc_pipeline.backfill.watermark import Watermark
from cdc_pipeline.capture.drain import Drain, DrainStats
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.delivery.engine import Deliverer, DeliveryStats
from cdc_pipeline.postgres import session
from cdc_pipeline.state.backfills import BackfillStore


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


@dataclass(frozen=True)
class OpenPage:
    backfill_id: str
    rows: int  # rows read and staged
    token: str  # the page's snapshot token, which its high watermark carries
    mac_key: str  # the backfill's watermark key
    close: Callable[[], None]  # emit the high watermark and release the backfill


@contextmanager
def backfill_page(config: PipelineConfig, table: str, limit: int) -> Iterator[OpenPage]:
    """The first page of a backfill of `table`, by hand: claimed, low watermark, read and staged; the test
    acts between the watermarks, then calls `close()`. The sessions stay open until the block ends."""
    spec = resolve(config, BackfillRequest(table))
    schema = config.state.schema_name
    store = BackfillStore(schema)
    with session.connect(config.source.dsn, autocommit=True) as src, \
            session.connect(config.state_dsn, autocommit=True) as state:
        src.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        shape = table_shape(src, spec, config.source.publication)
        bid, _ = store.claim(state, spec, shape.primary_key, shape.keyset, "test", None)
        key = store.mac_key(state, bid)
        emit(src, Watermark(bid, 0, "low"), key)
        page = PageReader(schema, spec, shape, True, 5000).read_and_stage(src, state, bid, 0, None, limit)

        def close() -> None:
            emit(src, Watermark(bid, 0, "high", token=page.token), key)
            store.release(state, bid)

        yield OpenPage(bid, page.rows, page.token, key, close)


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


def _digest(dsn: str, table: str, order: str) -> tuple[int, str]:
    """(rows, md5 of the rows' JSON texts in `rows()` order), computed inside PostgreSQL."""
    schema, _, name = table.partition(".")
    with psycopg.connect(dsn) as conn:
        row = conn.execute(psycopg.sql.SQL(
            "SELECT count(*), md5(coalesce(string_agg(j::text, E'\\n'), '')) "
            "FROM (SELECT to_jsonb(t) AS j FROM {} t ORDER BY {}) s").format(
                psycopg.sql.Identifier(schema, name), psycopg.sql.SQL(order))).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def assert_mirrored(source_dsn: str, source_table: str, dest_dsn: str, dest_table: str, order: str = "1") -> int:
    # Equal digests mean identical JSON texts row by row, so equal rows: big tables are compared without
    # loading them into Python. Any difference falls through to the row-by-row comparison, which decides.
    digest = _digest(source_dsn, source_table, order)
    if digest == _digest(dest_dsn, dest_table, order):
        return digest[0]
    src = rows(source_dsn, source_table, order)
    dst = rows(dest_dsn, dest_table, order)
    assert len(dst) == len(src), f"{dest_table}: {len(dst)} rows, source has {len(src)}"
    for a, b in zip(src, dst, strict=True):
        assert a == b, f"row differs:\nsource {a}\nmirror {b}"
    return len(src)


def wait_until(check: Callable[[], object], timeout: float = 120.0, what: str = "condition") -> None:
    """Poll `check` until it is truthy; fail naming `what` after `timeout` seconds (generous: the machine is
    shared and loaded, and a test must wait on the condition, never on a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.05)
