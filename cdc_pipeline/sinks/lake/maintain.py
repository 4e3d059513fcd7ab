"""Maintenance of the lake sinks' tables, and what they hold now.

    python -m cdc_pipeline.sinks.lake.maintain [--config cdc.yaml] [--sink NAME] [--retain-hours 168] [--dry-run]

For each table of each `delta` / `iceberg` sink: small files compacted up to the sink's `target_file_size`
(Delta: OPTIMIZE; Iceberg: the table rewritten in one overwrite when it has more files than its size needs),
then files and snapshots older than `--retain-hours` removed (Delta: VACUUM and a checkpoint; Iceberg:
snapshots expired). Safe beside a running `deliver`: each step is a commit of its own that loses a race with
the sink rather than undo it, and the sink's marks (lake/position.py) are kept: Delta keeps transaction
identifiers in every checkpoint; an Iceberg rewrite carries the summary properties forward. Prints one JSON
line per table: its location, version or snapshot, row count, files before and after.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.sinks.lake.position import SUMMARY_PREFIX

LAKE_TYPES = ("delta", "iceberg")


def lake_sinks(config: PipelineConfig, name: str | None = None) -> list[Any]:
    sinks = [s for s in config.sinks if s.destination.type in LAKE_TYPES and (name is None or s.name == name)]
    if name is not None and not sinks:
        raise ValueError(f"no delta or iceberg sink named {name!r}")
    return sinks


def maintain(config: PipelineConfig, sink: str | None = None, retain_hours: float = 168.0,
             dry_run: bool = False) -> list[dict[str, Any]]:
    """Compact and clean every table of the lake sinks (`sink`: only that one); a report per table."""
    out = []
    for s in lake_sinks(config, sink):
        dest = s.destination
        for source in s.tables:
            name = dest.table_for(source)
            step = _delta if dest.type == "delta" else _iceberg
            out.append({"sink": s.name, "table": name, **step(config, dest, name, retain_hours, dry_run)})
    return out


def _delta(config: PipelineConfig, dest: Any, name: str, retain_hours: float, dry_run: bool) -> dict[str, Any]:
    from deltalake import DeltaTable

    from cdc_pipeline.sinks.delta.client import table_uri

    uri = table_uri(dest.path, name)
    if not DeltaTable.is_deltatable(uri, storage_options=dict(dest.storage_options) or None):
        return {"location": uri.split("?")[0], "missing": True}
    dt = DeltaTable(uri, storage_options=dict(dest.storage_options) or None)
    before = len(dt.file_uris())
    if not dry_run:
        dt.optimize.compact(target_size=dest.target_file_size)
        dt.vacuum(retention_hours=int(retain_hours), dry_run=False, enforce_retention_duration=False)
        dt.create_checkpoint()
        dt.update_incremental()
    return {"location": uri.split("?")[0], "version": dt.version(), "rows": dt.count(),
            "files_before": before, "files_after": len(dt.file_uris())}


def _iceberg(config: PipelineConfig, dest: Any, name: str, retain_hours: float, dry_run: bool) -> dict[str, Any]:
    from pyiceberg.exceptions import NoSuchTableError

    from cdc_pipeline.sinks.iceberg.catalog import load_catalog

    namespace, _, table_name = name.rpartition(".")
    catalog = load_catalog(dest, config.state_dsn, config.state.schema_name)
    try:
        return _iceberg_table(catalog, (namespace or "default", table_name), dest, retain_hours, dry_run)
    except NoSuchTableError:
        return {"location": name, "missing": True}
    finally:
        if hasattr(catalog, "engine"):
            catalog.engine.dispose()


def _iceberg_table(catalog: Any, ident: tuple[str, str], dest: Any, retain_hours: float,
                   dry_run: bool) -> dict[str, Any]:
    table = catalog.load_table(ident)
    files = table.inspect.files()
    before = files.num_rows
    size = sum(files.column("file_size_in_bytes").to_pylist())
    if not dry_run and before > max(1, math.ceil(size / dest.target_file_size)):
        table.overwrite(table.scan().to_arrow(), snapshot_properties=carried_marks(table))
    if not dry_run:
        older = datetime.now(UTC) - timedelta(hours=retain_hours)
        table.maintenance.expire_snapshots().older_than(older).commit()
    table = catalog.load_table(ident)
    snapshot = table.current_snapshot()
    return {"location": table.location(), "snapshot": snapshot.snapshot_id if snapshot else None,
            "rows": int(snapshot.summary.additional_properties.get("total-records", 0)) if snapshot and
            snapshot.summary else 0, "files_before": before, "files_after": table.inspect.files().num_rows}


def carried_marks(table: Any) -> dict[str, str]:
    """Every sink's latest marks found back through the table's ancestry, to write on a rewrite's snapshot."""
    found: dict[str, str] = {}
    snapshot = table.current_snapshot()
    while snapshot is not None:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        for k, v in props.items():
            if k.startswith(SUMMARY_PREFIX + ".") and k not in found:
                found[k] = v
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_pipeline.sinks.lake.maintain",
                                     description="Compact and clean the delta / iceberg sinks' tables.")
    parser.add_argument("--config", default=os.environ.get("CDC_CONFIG", "cdc.yaml"))
    parser.add_argument("--sink", default=None, help="only this sink")
    parser.add_argument("--retain-hours", type=float, default=168.0,
                        help="keep files and snapshots this recent (time travel, readers still running)")
    parser.add_argument("--dry-run", action="store_true", help="report only")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        reports = maintain(config, args.sink, args.retain_hours, args.dry_run)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for report in reports:
        print(json.dumps(report, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
