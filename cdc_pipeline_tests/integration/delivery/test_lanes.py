"""Lanes (`lanes: N`, core/lanes.py) as users run them: one `deliver --lane I` process per lane, under concurrent
writers, with a lane SIGKILLed and restarted, then the split changed from 2 to 3 while the writers go on. The
mirror ends equal to the source; the append sink holds every change once and no group ever went backwards."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import yaml

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.admin.status import collect
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import assert_mirrored, mirror_config, wait_until
from cdc_pipeline_tests.processes import CLI

KEYS = 300


@contextmanager
def processes(tmp: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start CLI processes with their output in files (a pipe nobody reads would block a chatty one); every
    one still running at the end is killed."""
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


def _exits(proc: subprocess.Popen[bytes], timeout: float, tmp: Path) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        logs = "\n".join(p.read_text()[-1500:] for p in sorted(tmp.glob("p*.log")))
        raise AssertionError(f"{proc.args} still running after {timeout} s:\n{logs}") from None


def test_lanes_as_processes_survive_a_kill_and_a_change_of_split(
        source_db: Database, db_factory: Callable[[], Database], write_config: Callable[..., PipelineConfig],
        tmp_path: Path) -> None:
    dest = db_factory()
    source_db.execute("CREATE TABLE public.t (id integer PRIMARY KEY, v integer NOT NULL)")
    data: dict[str, Any] = mirror_config(source_db.dsn, dest.dsn, ["public.t"], lanes=2)
    data["delivery"] = {"idle_seconds": 0.05, "batch_size": 200}
    data["sinks"].append({"name": "app", "tables": ["public.t"], "lanes": 2, "destination": {
        "type": "postgres", "dsn": dest.dsn, "table": "out.events", "mode": "append"}})
    config = write_config(data)
    setup(config)
    path = str(config.path)
    stop_writers = threading.Event()

    def write(seed: int) -> None:  # inserts and updates of 300 keys from two connections: ~2 x 150 changes/s
        n = seed
        with psycopg.connect(source_db.dsn, autocommit=True) as conn:
            while not stop_writers.wait(0.005):
                n += 7
                conn.execute("INSERT INTO public.t VALUES (%s, 0) ON CONFLICT (id) DO UPDATE SET v = t.v + 1",
                             (n % KEYS,))

    writers = [threading.Thread(target=write, args=(s,), daemon=True) for s in (1, 2)]
    for w in writers:
        w.start()

    def mirrored() -> int:
        try:
            with psycopg.connect(dest.dsn) as conn:
                return int(conn.execute("SELECT count(*) FROM mirror.t").fetchone()[0])
        except psycopg.errors.UndefinedTable:
            return 0

    def lane_offset(lane: int, sink: str = "mirror") -> tuple[int, int]:
        with psycopg.connect(config.state_dsn) as conn:
            row = conn.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.sink_offsets WHERE sink = %s "
                               "AND lane = %s", (sink, lane)).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, -1)

    with processes(tmp_path) as start:
        try:
            start("--config", path, "drain")
            lanes = {i: start("--config", path, "deliver", "--sink", "mirror", "--lane", str(i)) for i in (0, 1)}
            apps = {i: start("--config", path, "deliver", "--sink", "app", "--lane", str(i)) for i in (0, 1)}
            wait_until(lambda: mirrored() >= 100, 120, "both lanes to deliver")

            lanes[1].kill()  # SIGKILL mid-stream: its lane resumes from its offset
            lanes[1].wait()
            killed_at = lane_offset(1)
            lanes[1] = start("--config", path, "deliver", "--sink", "mirror", "--lane", "1")
            wait_until(lambda: lane_offset(1) > killed_at, 120, "the restarted lane to deliver")

            # Lane 1 dies again and falls behind lane 0; then the split changes while the writers go on: the
            # new lanes ask the old ones to stop, wait for them, start at the lowest old offset and skip what
            # an old lane had settled.
            for proc in (lanes[1], apps[1]):
                proc.kill()
                proc.wait()
            behind = min(lane_offset(1), lane_offset(1, "app"))
            wait_until(lambda: min(lane_offset(0), lane_offset(0, "app"))[0] > behind[0] + 50_000, 60,
                       "lanes 0 to get ahead of the dead lanes 1")
            for sink in data["sinks"]:
                sink["lanes"] = 3
            Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
            new = [start("--config", path, "deliver", "--sink", "mirror", "--lane", str(i)) for i in range(3)]
            new_app = start("--config", path, "deliver", "--sink", "app")  # all three lanes in one process
            for old in (*lanes.values(), *apps.values()):
                assert _exits(old, 60, tmp_path) in (0, -signal.SIGKILL)  # stopped by the change, cleanly
            wait_until(lambda: all(p.poll() is None for p in [*new, new_app]), 5, "the new lanes to run")
        finally:
            stop_writers.set()
            for w in writers:
                w.join()

        want = int(source_db.execute("SELECT count(*) FROM public.t")[0][0])
        written = int(source_db.execute("SELECT count(*) + sum(v) FROM public.t")[0][0])  # inserts + updates

        def caught_up() -> bool:
            with psycopg.connect(dest.dsn) as conn:
                appended = int(conn.execute("SELECT count(*) FROM out.events").fetchone()[0])
            lags = [collect(config)["sinks"][s]["lag_messages"] for s in ("mirror", "app")]
            return mirrored() == want and appended == written and lags == [0, 0]

        wait_until(caught_up, 180, "every lane to catch up")
        for proc in [*new, new_app]:
            proc.send_signal(signal.SIGTERM)
            assert _exits(proc, 60, tmp_path) == 0

    assert_mirrored(source_db.dsn, "public.t", dest.dsn, "mirror.t")
    # The append sink: each change once (its idempotency key), and per key in commit order of delivery.
    rows = dest.execute("SELECT idempotency_key, message->'record'->>'id', delivered_at FROM out.events")
    assert len(rows) == len({r[0] for r in rows})
    by_key: dict[str, list[tuple[Any, tuple[int, int]]]] = defaultdict(list)
    for key, record_id, at in rows:
        lsn, idx = key.split(":")
        by_key[record_id].append((at, (int(lsn), int(idx))))
    for record_id, seen in by_key.items():
        positions = [pos for _, pos in sorted(seen)]
        assert positions == sorted(positions), f"key {record_id} went backwards on the append sink"
    status = collect(config)
    assert [lane["lane"] for lane in status["sinks"]["mirror"]["lanes"]] == [0, 1, 2]
    assert status["sinks"]["mirror"]["lag_messages"] == 0
