"""Lake sinks at their interface (issue 37): rows/s into Delta and Iceberg, `append` and `mirror`, against the
libraries' own ceiling (a plain `write_deltalake` / pyiceberg `append` of the same Arrow batches, as the
append sink builds them) and against the Parquet sink (Spark; its start-up not counted).

    python bench/lake.py                              # 100,000 messages in calls of 20,000, every target
    python bench/lake.py --messages 200000 --batch 20000 --skip-parquet

Each call is what the engine hands a sink (one deliver() per batch_size log rows). The mirror run first inserts
every key, then updates every key again (half the updates leave the `note` column out, as an unchanged TOAST
value, so the table's row supplies it): the second pass is the figure (merge into existing rows). Iceberg's
catalog is SQLite in a temporary directory (the sink's default is the state database; this measures the
table writes). Prints one line per target: rows, seconds, rows/s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cdc_pipeline.postgres.catalog import ColumnInfo, TableInfo  # noqa: E402
from cdc_pipeline.sinks import build_sink  # noqa: E402
from cdc_pipeline.sinks.base import OutboundMessage, Sink  # noqa: E402
from cdc_pipeline.sinks.delta import DeltaDestination  # noqa: E402
from cdc_pipeline.sinks.iceberg import IcebergCatalog, IcebergDestination  # noqa: E402

COLUMNS = (("id", "bigint", 20), ("account_id", "integer", 23), ("status", "text", 25),
           ("amount", "numeric(12,2)", 1700), ("created_at", "timestamp with time zone", 1184), ("note", "text", 25))
INFO = TableInfo("public", "orders", tuple(ColumnInfo(n, t, oid, t == "text", n == "id") for n, t, oid in COLUMNS),
                 ("id",), "d", ("id",))


def message(i: int, key: int, action: str, toast: bool) -> OutboundMessage:
    record: dict[str, Any] = {"id": key, "account_id": key % 1000, "status": "paid" if i % 3 else "open",
                              "amount": f"{key % 100000}.{i % 100:02d}", "created_at": "2026-11-27T01:02:03.456789+00:00"}
    if not toast:
        record["note"] = f"note {i}"
    lsn = 10_000_000 + i
    body = {"record": record, "changes": None, "action": action,
            "metadata": {"table_schema": "public", "table_name": "orders", "commit_timestamp": "2026-11-27T01:02:03Z",
                         "commit_lsn": lsn, "commit_idx": 0, "idempotency_key": f"{lsn}:0"}}
    return OutboundMessage(f"{lsn}:0", str(key), None, json.dumps(body).replace(
        f'"amount": "{record["amount"]}"', f'"amount": {record["amount"]}').encode())


def batches(n: int, size: int, offset: int, action: str, keys: int) -> list[list[OutboundMessage]]:
    msgs = [message(offset + i, i % keys, action, action == "update" and i % 2 == 0) for i in range(n)]
    return [msgs[i:i + size] for i in range(0, n, size)]


def run_sink(sink: Sink, calls: list[list[OutboundMessage]]) -> float:
    started = time.perf_counter()
    for call in calls:
        results = sink.deliver(call)
        assert all(r is None for r in results), results[:3]
    return time.perf_counter() - started


def lake_sink(fmt: str, mode: str, root: Path) -> Sink:
    root.mkdir(parents=True, exist_ok=True)
    if fmt == "delta":
        dest: Any = DeltaDestination(path=str(root / "delta"), mode=mode, table="bench.orders")
    else:
        dest = IcebergDestination(warehouse=f"file://{root}/warehouse", mode=mode, table="bench.orders",
                                  catalog=IcebergCatalog(uri=f"sqlite:///{root}/catalog.db"))
    sink = build_sink(SimpleNamespace(name=f"{fmt}_{mode}", tables=["public.orders"], destination=dest))
    sink.open()
    sink.context.describe = lambda table: INFO
    return sink


def measure(name: str, rows: int, seconds: float) -> None:
    print(f"{name:<28} {rows:>9,} rows {seconds:8.2f} s {rows / seconds:>10,.0f} rows/s", flush=True)


def plain_writes(fmt: str, root: Path, calls: list[list[OutboundMessage]]) -> float:
    """The library's ceiling: the append sink's Arrow batches, built beforehand, written by the library alone."""
    from cdc_pipeline.sinks.lake import rows

    sink = lake_sink(fmt, "append", root / "shape")
    shape = sink.shape("public.orders")  # type: ignore[attr-defined]
    tables = [rows.append_table(shape, [rows.parse(m.payload) for m in call]) for call in calls]
    if fmt == "delta":
        from deltalake import write_deltalake

        started = time.perf_counter()
        for t in tables:
            write_deltalake(str(root / "plain_delta"), t, mode="append")
        return time.perf_counter() - started
    from pyiceberg.catalog.sql import SqlCatalog

    root.mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog("plain", uri=f"sqlite:///{root}/plain.db", warehouse=f"file://{root}/plain_wh")
    catalog.create_namespace("bench")
    table = catalog.create_table(("bench", "orders"), tables[0].schema)
    started = time.perf_counter()
    for t in tables:
        table.append(t)
    return time.perf_counter() - started


def parquet(calls: list[list[OutboundMessage]], root: Path) -> float:
    from pyspark.sql import SparkSession

    from cdc_pipeline.sinks.parquet.client import ParquetSink

    spark = SparkSession.builder.master("local[2]").getOrCreate()
    spark.range(1).count()  # start-up not counted
    sink = ParquetSink(SimpleNamespace(name="pq", destination=SimpleNamespace(path=f"file://{root}/parquet")))
    sink.context.spark = spark
    try:
        return run_sink(sink, calls)
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--formats", default="delta,iceberg")
    parser.add_argument("--skip-parquet", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-lake-"))
    n, size = args.messages, args.batch
    inserts = batches(n, size, 0, "insert", n)
    updates = batches(n, size, n, "update", n)
    targets: list[tuple[str, Callable[[], float]]] = []
    for fmt in args.formats.split(","):
        targets += [
            (f"{fmt} plain append", lambda fmt=fmt: plain_writes(fmt, root / f"{fmt}_plain", inserts)),
            (f"{fmt} sink append", lambda fmt=fmt: run_sink(lake_sink(fmt, "append", root / f"{fmt}_a"), inserts)),
            (f"{fmt} sink mirror update", lambda fmt=fmt: _mirror(fmt, root / f"{fmt}_m", inserts, updates)),
        ]
    if not args.skip_parquet:
        targets.append(("parquet sink (spark)", lambda: parquet(inserts, root)))
    try:
        for name, run in targets:
            measure(name, n, run())
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _mirror(fmt: str, root: Path, inserts: list[list[OutboundMessage]], updates: list[list[OutboundMessage]]) -> float:
    sink = lake_sink(fmt, "mirror", root)
    first = run_sink(sink, inserts)
    measure(f"{fmt} sink mirror insert", sum(map(len, inserts)), first)
    return run_sink(sink, updates)


if __name__ == "__main__":
    main()
