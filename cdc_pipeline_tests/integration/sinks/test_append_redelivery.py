"""An append sink's promise "a redelivery inserts nothing twice", with real redeliveries through the CLI: a
`replay` of everything already delivered, and a full redelivery after both recorded positions (the state's
offset and the sink's own) are reset to the start of the log."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import psycopg

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import drain, mirror_config
from cdc_pipeline_tests.integration.admin.test_cli_errors import CLI


def cli(config_path: Path, *args: str) -> str:
    proc = subprocess.run([CLI, "--config", str(config_path), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def appended(dest: Database) -> list[tuple[Any, ...]]:
    return dest.execute("SELECT idempotency_key, action, message, delivered_at FROM out.events ORDER BY 1")


def delivered(source_db: Database) -> int:
    return int(source_db.execute("SELECT delivered FROM cdc_pipeline.sink_offsets WHERE sink = 'app'")[0][0])


def test_append_redelivery_inserts_nothing_twice(source_db: Database, db_factory, write_config) -> None:
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    data["sinks"] = [{"name": "app", "tables": ["public.t"],
                      "destination": {"type": "postgres", "dsn": dest.dsn, "table": "out.events", "mode": "append"}}]
    config = write_config(data)
    setup(config)
    start = source_db.execute("SELECT clock_timestamp()")[0][0].isoformat()
    source_db.execute("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 30) g")
    source_db.execute("UPDATE t SET v = 'b' WHERE id <= 10")
    source_db.execute("DELETE FROM t WHERE id > 25")
    drain(config)
    cli(config.path, "deliver", "--sink", "app", "--until-idle")
    first = appended(dest)
    assert len(first) == 45 and len({r[0] for r in first}) == 45
    assert delivered(source_db) == 45

    # A replay of everything delivered so far sends the same 45 messages again: none is inserted twice, and
    # the rows already there are left as they were (same delivered_at).
    cli(config.path, "replay", "--sink", "app", "--from", start)
    assert appended(dest) == first

    # Both positions back to the start of the log: the next run delivers all 45 again (counted), plus a
    # new change once.
    source_db.execute("UPDATE cdc_pipeline.sink_offsets SET commit_lsn = 0, commit_idx = -1 WHERE sink = 'app'")
    dest.execute("DELETE FROM cdc_pipeline_sink.offsets WHERE sink = 'app'")
    source_db.execute("INSERT INTO t VALUES (100, 'new')")
    drain(config)
    cli(config.path, "deliver", "--sink", "app", "--until-idle")
    assert delivered(source_db) == 45 + 46, "the redelivery did not happen"
    after, keys = appended(dest), {r[0] for r in first}
    assert len(after) == 46 and len({r[0] for r in after}) == 46
    assert [r for r in after if r[0] in keys] == first
    assert [r[1] for r in after if r[0] not in keys] == ["insert"]
    with psycopg.connect(config.state_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM cdc_pipeline.failed_messages").fetchone() == (0,)
