"""Lake test helpers: a pipeline config with a `delta` or `iceberg` sink, and the lake tables read back through
the formats' own readers (deltalake, pyiceberg)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from cdc_pipeline.config import PipelineConfig


def lake_config(source_dsn: str, tables: list[str], fmt: str, mode: str, root: Path, **dest: Any) -> dict[str, Any]:
    destination: dict[str, Any] = {"type": fmt, "mode": mode, "flush_seconds": 0, **dest}
    if fmt == "delta":
        destination.setdefault("path", str(root / "delta"))
    else:
        destination.setdefault("warehouse", f"file://{root}/warehouse")
    return {
        "source": {"dsn": source_dsn, "slot": "cdc_test", "publication": "cdc_test"},
        "drain": {"heartbeat_seconds": 1, "batch_ms": 200},
        "tables": [{"name": t} for t in tables],
        "sinks": [{"name": "lake", "tables": tables, "destination": destination}],
    }


def read_table(config: PipelineConfig, source_table: str, sink: str = "lake") -> pa.Table:
    """The lake table of `source_table`, read by the format's own reader."""
    sink_config = config.sink(sink)
    dest = sink_config.destination
    name = dest.table_for(source_table)
    if dest.type == "delta":
        from deltalake import DeltaTable, QueryBuilder

        # delta-rs' own reader: pyarrow's dataset of the table fails on a BC date in its statistics
        table = DeltaTable(f"{dest.path.rstrip('/')}/{name}")
        return plain(pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t")))
    from cdc_pipeline.sinks.iceberg.catalog import load_catalog

    namespace, _, table = name.rpartition(".")
    catalog = load_catalog(dest, config.state_dsn, config.state.schema_name)
    try:
        return catalog.load_table((namespace, table)).scan().to_arrow()
    finally:
        catalog.engine.dispose()


def by_key(table: pa.Table, key: str, columns: list[str]) -> dict[Any, tuple[Any, ...]]:
    out: dict[Any, tuple[Any, ...]] = {}
    for row in table.select(columns).to_pylist():
        assert row[key] not in out, f"key {row[key]} twice in the lake table"
        out[row[key]] = tuple(row[c] for c in columns)
    return out


def plain(table: pa.Table) -> pa.Table:
    """View types (what delta-rs' engine returns) as plain strings and binaries."""
    fields = [pa.field(f.name, pa.string() if pa.types.is_string_view(f.type) else
                       pa.binary() if pa.types.is_binary_view(f.type) else f.type) for f in table.schema]
    return table.cast(pa.schema(fields))
