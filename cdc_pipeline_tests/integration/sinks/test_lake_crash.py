"""Lake sinks under SIGKILL: four sinks (Delta and Iceberg, mirror and append) delivered by one real
`cdc-pipeline deliver` while two writers change the source and a drain runs; the deliver is SIGKILLed
again and again: just before a table commit, just after one (the table holds a batch the state's offset does
not: the case exactly-once is about), and at random moments. At the end, read back by deltalake and pyiceberg
each mirror equals the source row by row; each append table holds every
change of the log exactly once, with the log's values, and per key in commit order."""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import psycopg
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.sinks.lake.fault import ENV
from cdc_pipeline_tests import processes
from cdc_pipeline_tests.helpers import wait_until
from cdc_pipeline_tests.integration.ops.test_crash_recovery import (
    DDL,
    TABLES,
    finish,
    join_writers,
    run_writers,
    spawn,
)
from cdc_pipeline_tests.lake import by_key, read_table

SINKS = [("delta_mirror", "delta", "mirror"), ("delta_append", "delta", "append"),
         ("ice_mirror", "iceberg", "mirror"), ("ice_append", "iceberg", "append")]
# Each deliver dies at its plan's step; the counts land kills on different tables and sinks of a call.
PLANS = ["after_commit:1", "before_commit:2", "after_commit:3", "random", "after_commit:6", "before_commit:5"]


def crash_config(source_dsn: str, root: Any) -> dict[str, Any]:
    sinks = []
    for name, fmt, mode in SINKS:
        dest: dict[str, Any] = {"type": fmt, "mode": mode, "flush_seconds": 0.2,
                                "table": f"{name}.{{table}}"}
        dest.update({"path": str(root / "delta")} if fmt == "delta" else {"warehouse": f"file://{root}/warehouse"})
        sinks.append({"name": name, "tables": TABLES, "destination": dest})
    return {
        "source": {"dsn": source_dsn, "slot": "cdc_test", "publication": "cdc_test"},
        "drain": {"heartbeat_seconds": 0.5, "batch_ms": 100},
        "delivery": {"batch_size": 700, "idle_seconds": 0.1},
        "tables": [{"name": t} for t in TABLES],
        "sinks": sinks,
    }


def _log_positions(state_dsn: str, table: str) -> list[tuple[int, int]]:
    with psycopg.connect(state_dsn) as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT commit_lsn, commit_idx FROM cdc_pipeline.change_log WHERE table_schema = 'public' "
            "AND table_name = %s AND action IN ('insert', 'update', 'delete') ORDER BY 1, 2", (table,)).fetchall()]


def _commits(state_dsn: str) -> int:
    with psycopg.connect(state_dsn) as conn:
        row = conn.execute("SELECT coalesce(sum(delivered), 0) FROM cdc_pipeline.sink_offsets").fetchone()
        return int(row[0]) if row else 0


def _run_killed(config: Any, plan: str, rng: random.Random) -> None:
    """One deliver that dies by its plan (or is SIGKILLed at a random moment after making progress)."""
    before = _commits(config.state_dsn)
    env = {ENV: plan} if plan != "random" else {}
    proc = processes.spawn(config.path, "deliver", "--seconds", "120", env=env)
    if plan == "random":
        wait_until(lambda: proc.poll() is not None or _commits(config.state_dsn) > before, 60, "deliver progress")
        time.sleep(rng.uniform(0.0, 1.0))  # a random moment to kill at, not a wait for something
        assert proc.poll() is None, finish(proc, 10)
        os.killpg(proc.pid, signal.SIGKILL)
    rc, out, err = finish(proc, 120)
    assert rc == -signal.SIGKILL, f"deliver ({plan}) was not killed (rc {rc}):\n{out}\n{err[-3000:]}"


@pytest.mark.slow
def test_lake_sinks_under_sigkill(source_db, write_config, tmp_path):
    seed = int(os.environ.get("CDC_CRASH_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (rerun with CDC_CRASH_SEED={seed})")
    rng = random.Random(seed)
    source_db.execute(DDL)
    config = write_config(crash_config(source_db.dsn, tmp_path))
    setup(config)
    writers = run_writers(source_db.dsn, 6_000, rate=1_500, seed=seed)
    drainer = spawn(config, "drain", "--seconds", "300")
    try:
        for plan in PLANS:
            _run_killed(config, plan, rng)
        txns = join_writers(writers)
        assert sum(txns.values()) >= 6_000
        os.killpg(drainer.pid, signal.SIGTERM)
        rc, out, err = finish(drainer, 60)
        assert rc == 0, f"drain failed:\n{out}\n{err}"
        rc, out, err = finish(spawn(config, "drain", "--until-idle"), 60)
        assert rc == 0, err
        rc, out, err = finish(spawn(config, "deliver", "--until-idle"), 180)
        assert rc == 0, f"final deliver failed:\n{out}\n{err[-3000:]}"
    finally:
        if drainer.poll() is None:
            os.killpg(drainer.pid, signal.SIGKILL)
            drainer.wait(10)
    _assert_mirrors(config, source_db.dsn)
    _assert_histories(config)
    with psycopg.connect(config.state_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM cdc_pipeline.failed_messages").fetchone() == (0,)


def _assert_mirrors(config: Any, source_dsn: str) -> None:
    with psycopg.connect(source_dsn) as conn:
        acct = {r[0]: tuple(r) for r in conn.execute("SELECT id, ver, owner, note FROM acct").fetchall()}
        evt = {r[0]: tuple(r) for r in conn.execute("SELECT k, ver, n, tags FROM evt").fetchall()}
    for sink in ("delta_mirror", "ice_mirror"):
        assert by_key(read_table(config, "public.acct", sink), "id", ["id", "ver", "owner", "note"]) == acct, sink
        assert by_key(read_table(config, "public.evt", sink), "k", ["k", "ver", "n", "tags"]) == evt, sink


def _assert_histories(config: Any) -> None:
    for sink in ("delta_append", "ice_append"):
        for source, key in (("acct", "id"), ("evt", "k")):
            table = read_table(config, f"public.{source}", sink)
            got = list(zip(table.column("commit_lsn").to_pylist(), table.column("commit_idx").to_pylist(), strict=True))
            assert len(got) == len(set(got)), f"{sink}.{source}: {len(got) - len(set(got))} changes twice"
            assert sorted(got) == _log_positions(config.state_dsn, source), f"{sink}.{source}: not every change"
            rows = sorted(table.select(["commit_lsn", "commit_idx", key, "ver", "action"]).to_pylist(),
                          key=lambda r: (r["commit_lsn"], r["commit_idx"]))
            last: dict[Any, int] = {}
            for r in rows:  # each writer raises `ver` with every write of a key it owns
                if r["action"] != "delete" and r["ver"] is not None:
                    assert r["ver"] >= last.get(r[key], 0), f"{sink}.{source}: key {r[key]} out of order"
                    last[r[key]] = r["ver"]
