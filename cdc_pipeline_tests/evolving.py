"""Shared by the source-evolution tests (partitioned tables, schema changes, generated columns): CLI processes
with their output in files, writers on their own connections, and the append sink's history replayed."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from cdc_pipeline.admin.status import collect
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests.helpers import assert_mirrored, mirror_config, wait_until
from cdc_pipeline_tests.processes import CLI


def mirror_and_append(source_dsn: str, dest_dsn: str, table: str, append_table: str,
                      batch_size: int = 500) -> dict[str, Any]:
    """A config with a mirror (`mirror.<table>`) and an append sink `app` (``append_table``) of one table."""
    data = mirror_config(source_dsn, dest_dsn, [table])
    data["delivery"] = {"idle_seconds": 0.05, "batch_size": batch_size}
    data["sinks"].append({"name": "app", "tables": [table], "destination": {
        "type": "postgres", "dsn": dest_dsn, "table": append_table, "mode": "append"}})
    return data


@contextmanager
def processes(tmp: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start CLI processes with their output in files; every one still running at the end is killed."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        log = open(tmp / f"p{len(started)}.log", "wb")  # noqa: SIM115 - the child holds it
        proc = subprocess.Popen([CLI, *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def logs(tmp: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(tmp.glob("p*.log")))


class Pipeline:
    """`drain` and `deliver` of one config running as users run them (``streaming``)."""

    def __init__(self, start: Callable[..., subprocess.Popen[bytes]], config: PipelineConfig, tmp: Path) -> None:
        self.start, self.path, self.tmp = start, str(config.path), tmp
        self.drain = start("--config", self.path, "drain")
        self.deliver = start("--config", self.path, "deliver")

    def run(self, *args: str, timeout: float = 180) -> None:
        """Another command of the same config, to its end: it must succeed."""
        proc = self.start("--config", self.path, *args)
        assert proc.wait(timeout) == 0, logs(self.tmp)

    def stop_when(self, done: Callable[[], bool], timeout: float = 120) -> None:
        """Once ``done`` holds, SIGTERM both: each must end cleanly."""
        wait_until(done, timeout, "the sinks to catch up")
        for proc in (self.deliver, self.drain):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, logs(self.tmp)


@contextmanager
def streaming(tmp: Path, config: PipelineConfig) -> Iterator[Pipeline]:
    with processes(tmp) as start:
        yield Pipeline(start, config, tmp)


class Writers:
    """Threads each running ``step(conn, n)`` in a loop on their own autocommit connection until stopped;
    ``step`` returns how many change messages it caused, summed in ``changes``."""

    def __init__(self, dsn: str, step: Callable[[psycopg.Connection, int], int], count: int = 2) -> None:
        self.dsn, self.step = dsn, step
        self.stop_event = threading.Event()
        self.changes = 0
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)]

    def _run(self, seed: int) -> None:
        n = seed
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop_event.wait(0.003):
                    n += len(self._threads)
                    done = self.step(conn, n)
                    with self._lock:
                        self.changes += done
        except BaseException as exc:  # surfaced by stop()
            self.errors.append(exc)

    def __enter__(self) -> Writers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self._threads:
            t.join()
        assert not self.errors, self.errors


def appended(dsn: str, table: str) -> list[dict[str, Any]]:
    """The append sink's messages in commit order."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT message FROM {table} ORDER BY commit_lsn, commit_idx").fetchall()  # noqa: S608
    return [r[0] for r in rows]


def assert_append_history(dsn: str, table: str, key: tuple[str, ...], source_rows: list[dict[str, Any]],
                          changes: int | None = None) -> None:
    """Every message once (the key is the table's primary key), per key in commit order of delivery, and
    replaying the messages in commit order gives the source's rows; ``changes``: how many non-read messages."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT idempotency_key, message, delivered_at FROM {table}").fetchall()  # noqa: S608
    assert len(rows) == len({r[0] for r in rows})
    by_key: dict[str, list[tuple[Any, tuple[int, int]]]] = defaultdict(list)
    for _, m, at in rows:
        meta = m["metadata"]
        by_key[json.dumps([m["record"].get(k) for k in key])].append((at, (meta["commit_lsn"], meta["commit_idx"])))
    for k, seen in by_key.items():
        positions = [pos for _, pos in sorted(seen)]
        assert positions == sorted(positions), f"key {k} went backwards on the append sink"
    state: dict[str, dict[str, Any]] = {}
    for m in appended(dsn, table):
        ident = json.dumps([m["record"].get(k) for k in key])
        if m["action"] == "delete":
            state.pop(ident, None)
            continue
        old = {**m["record"], **(m.get("changes") or {})}
        state.pop(json.dumps([old.get(k) for k in key]), None)  # an update of the key leaves its old key
        state[ident] = m["record"]
    want = {json.dumps([r.get(k) for k in key]): r for r in source_rows}
    assert state.keys() == want.keys(), (sorted(set(state) ^ set(want))[:10])
    for ident, row in want.items():
        assert state[ident] == row, f"{ident}: replayed {state[ident]}, source {row}"
    if changes is not None:
        assert sum(1 for r in rows if r[1]["action"] != "read") == changes


def source_records(dsn: str, table: str) -> list[dict[str, Any]]:
    """The source's rows as records (to_jsonb, as the pipeline makes them)."""
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute(f"SELECT to_jsonb(t) FROM {table} t").fetchall()]  # noqa: S608


def caught_up(config: PipelineConfig, source_dsn: str, dest_dsn: str, table: str, order: str) -> bool:
    """`mirror_and_append`'s sinks have everything: the mirror equal to the source first (their lags count
    only what the drain has logged so far, not the changes it has yet to read), both lags 0, and no
    backfill active (a re-read the drain started)."""
    try:
        assert_mirrored(source_dsn, table, dest_dsn, f"mirror.{table.partition('.')[2]}", order=order)
    except (AssertionError, psycopg.Error):
        return False
    lags = [collect(config)["sinks"][s]["lag_messages"] for s in ("mirror", "app")]
    with psycopg.connect(source_dsn) as conn:
        active = conn.execute(f"SELECT count(*) FROM {config.state.schema_name}.backfills "  # noqa: S608
                              "WHERE status IN ('running', 'paused')").fetchone()
    return lags == [0, 0] and active == (0,)
