"""SIGTERM, SIGINT and SIGHUP against the real long-running commands: each exits 0 within a bounded time,
leaves no process it started (psutil), and releases what it held; the demo stops `dagster dev` with its
children and the embedded cluster; a second signal forces."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import Popen

import psutil
import pytest
import yaml

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.demo.dagster_dev import free_port
from cdc_pipeline_tests.api_fakes import T0, FakeApi
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import mirror_config, wait_until
from cdc_pipeline_tests.integration.api_sync.test_api_sync import api_config, sf_source
from cdc_pipeline_tests.processes import assert_none_left, descendants, spawn, stop

SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]


@contextmanager
def _running(proc: Popen[str]) -> Iterator[Popen[str]]:
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _mirror(source_db: Database, dest: Database, write_config: Callable[..., PipelineConfig]) -> PipelineConfig:
    source_db.execute("CREATE TABLE public.t (id integer PRIMARY KEY, v text)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"]))
    setup(config)
    source_db.execute("INSERT INTO public.t SELECT g, 'v' FROM generate_series(1, 100) g")
    return config


def _slot_active(db: Database) -> bool:
    return bool(db.execute("SELECT coalesce(bool_or(active), false) FROM pg_replication_slots")[0][0])


def _sessions(db: Database, prefix: str) -> int:
    return int(db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
                          (prefix + "%",))[0][0])


def _signal_and_check(proc: Popen[str], signum: int, ready: Callable[[], object], timeout: float = 60) -> str:
    wait_until(lambda: proc.poll() is not None or ready(), 120, "the command to be running")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    started = descendants(proc.pid)
    t0 = time.monotonic()
    code, out, err = stop(proc, signum, timeout)
    assert code == 0, f"exit {code} after {signal.Signals(signum).name}:\n{err[-3000:]}"
    print(f"{proc.args[3:5]} stopped {time.monotonic() - t0:.1f} s after {signal.Signals(signum).name}")
    assert_none_left(started)
    return out


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: s.name)
def test_drain_stops_cleanly(signum: int, source_db: Database, db_factory: Callable[[], Database],
                             write_config: Callable[..., PipelineConfig]) -> None:
    config = _mirror(source_db, db_factory(), write_config)
    with _running(spawn(config.path, "drain", ignore_sigint=signum != signal.SIGINT)) as proc:
        out = _signal_and_check(proc, signum, lambda: _slot_active(source_db) and _logged(source_db) == 100)
    assert re.search(r"drained \d+ changes", out)
    wait_until(lambda: not _slot_active(source_db), 30, "the slot to be released")
    # Acknowledged as far as logged: the slot confirmed past the last logged change.
    assert source_db.execute(
        "SELECT (SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots) > "
        "(SELECT max(commit_lsn) FROM cdc_pipeline.change_log)")[0][0]


def _logged(db: Database) -> int:
    if not db.execute("SELECT to_regclass('cdc_pipeline.change_log')")[0][0]:
        return 0
    return int(db.execute("SELECT count(*) FROM cdc_pipeline.change_log")[0][0])


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: s.name)
def test_deliver_stops_cleanly(signum: int, source_db: Database, db_factory: Callable[[], Database],
                               write_config: Callable[..., PipelineConfig]) -> None:
    dest = db_factory()
    config = _mirror(source_db, dest, write_config)
    with _running(spawn(config.path, "drain")) as drainer, _running(spawn(config.path, "deliver")) as proc:
        _signal_and_check(proc, signum, lambda: _mirrored(dest) == 100)
        assert stop(drainer, signal.SIGTERM, 60)[0] == 0
    assert _sessions(source_db, "cdc-pipeline deliver") == 0
    offset = source_db.execute("SELECT delivered FROM cdc_pipeline.sink_offsets WHERE sink = 'mirror'")
    assert offset and offset[0][0] == 100, offset  # acknowledged as far as delivered


def _mirrored(dest: Database) -> int:
    if not dest.execute("SELECT to_regclass('mirror.t')")[0][0]:
        return 0
    return int(dest.execute("SELECT count(*) FROM mirror.t")[0][0])


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: s.name)
def test_serve_stops_cleanly(signum: int, source_db: Database, db_factory: Callable[[], Database],
                             write_config: Callable[..., PipelineConfig]) -> None:
    config = _mirror(source_db, db_factory(), write_config)
    port = free_port()

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/openapi.json", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    metrics = free_port()  # its metrics server (a thread) stops with it too
    with _running(spawn(config.path, "serve", "--port", str(port), "--metrics-port", str(metrics))) as proc:
        _signal_and_check(proc, signum, lambda: answers() and _answers(metrics))
    assert not answers() and not _answers(metrics)


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: s.name)
def test_api_sync_stops_cleanly(signum: int, source_db: Database, tmp_path: Path) -> None:
    with FakeApi("salesforce") as api:
        for i in range(300):
            api.put("Account", f"001{i:012d}", at=T0.replace(minute=i // 50), Name=f"a{i}")
        source = sf_source(api, [{"name": "Account", "table": "crm.accounts", "fields": {"Name": "text"},
                                  "page_size": 20}])
        source["rate_limit"] = {"requests": 10, "per_seconds": 2, "share": 0.5}  # slow: still running when signalled
        path = tmp_path / "cdc.yaml"
        path.write_text(yaml.safe_dump(api_config(source_db.dsn, source)))
        env = {"SF_ID": api.client_id, "SF_SECRET": api.client_secret}

        def checkpointed() -> bool:
            return bool(source_db.execute("SELECT to_regclass('cdc_pipeline.api_sync_collections')")[0][0]) and \
                bool(source_db.execute("SELECT count(*) FROM cdc_pipeline.api_sync_collections "
                                       "WHERE backfill_records > 0")[0][0])

        metrics = free_port()
        with _running(spawn(str(path), "api-sync", "--metrics-port", str(metrics), env=env)) as proc:
            out = _signal_and_check(proc, signum, lambda: checkpointed() and _answers(metrics))
    assert "api source sf:" in out
    assert not _answers(metrics)


def _postmaster(root: Path) -> psutil.Process | None:
    for pidfile in root.glob("**/postmaster.pid"):
        try:
            return psutil.Process(int(pidfile.read_text().split()[0]))
        except (psutil.Error, ValueError, OSError):
            return None
    return None


@contextmanager
def _demo_running(tmp_path: Path) -> Iterator[tuple[Popen[str], Path, dict[int, str]]]:
    """The demo, up to its sensors' runs (run workers and a JVM among its descendants): the process, its
    log, and every process it started (with the embedded cluster, a daemon outside its descendants)."""
    port = free_port()
    log = tmp_path / "demo.out"
    with log.open("w") as out, _running(Popen([*spawn_args(), "demo", "--port", str(port)], stdout=out,
                                              stderr=out, text=True, start_new_session=True)) as proc:
        wait_until(lambda: proc.poll() is not None or "config: " in log.read_text(), 300, "the demo to start")
        root = Path(re.search(r"^config: (.+)/cdc\.yaml$", log.read_text(), re.M).group(1))  # type: ignore[union-attr]
        wait_until(lambda: proc.poll() is not None or sum(n == "java" for n in descendants(proc.pid).values()) >= 1,
                   420, "a run worker's JVM")
        cluster = _postmaster(root)
        assert cluster is not None and cluster.is_running()
        _assert_quiet_console(log.read_text(), (root / "dagster.log").read_text(errors="replace"))
        yield proc, log, {**descendants(proc.pid), cluster.pid: cluster.name()}


# One demo start per case (each costs about a minute): the other signals' clean stops are the same handler
# (ops/signals.py), tested to completion on drain, deliver, serve and api-sync above.
def test_demo_stops_everything_it_started(tmp_path: Path) -> None:
    """SIGTERM (a process manager, `timeout`): `dagster dev` (daemon, webserver, code server, run workers,
    their JVMs) and the embedded cluster stop, and it exits 0."""
    with _demo_running(tmp_path) as (proc, log, started):
        root = Path(re.search(r"^config: (.+)/cdc\.yaml$", log.read_text(), re.M).group(1))  # type: ignore[union-attr]
        wait_until(lambda: "the drain run is streaming" in log.read_text(), 300, "the drain run")
        proc.send_signal(signal.SIGTERM)
        proc.wait(180)
    out = log.read_text()
    assert proc.returncode == 0, out[-3000:]
    assert_none_left(started, 60)
    # The runs were terminated as the UI does (Canceled, not Failure), and the folder is gone (no --keep).
    ended = re.search(r"runs ended: (.+)$", out, re.M)
    assert ended and "cdc_drain CANCELED" in ended[1] and "FAILURE" not in ended[1], out[-3000:]
    assert not root.exists() and f"removed the demo's folder {root}" in out


def test_demo_ctrl_c_then_a_closing_terminal_forces(tmp_path: Path) -> None:
    """Ctrl-C as a terminal sends it (SIGINT to the whole foreground process group) starts the clean stop;
    SIGHUP during it forces: exit 128 + 1 at once, everything it started killed, the cluster too."""
    with _demo_running(tmp_path) as (proc, log, started):
        os.killpg(proc.pid, signal.SIGINT)
        wait_until(lambda: proc.poll() is not None or "SIGINT: stopping cleanly" in log.read_text(), 60,
                   "the clean stop to begin")
        assert proc.poll() is None, "stopped before the second signal: " + log.read_text()[-3000:]
        t0 = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        proc.wait(60)
        forced_in = time.monotonic() - t0
    assert proc.returncode == 128 + signal.SIGHUP, log.read_text()[-3000:]
    assert forced_in < 30, f"the forced stop took {forced_in:.1f} s"
    assert_none_left(started, 60)


def _assert_quiet_console(console: str, dagster_log: str) -> None:
    """The demo's console says what a user needs, not Dagster's per-event lines (those are in its log);
    and the warnings `dagster dev` would print at start do not arise."""
    assert "Dagster UI: http://127.0.0.1:" in console and "Dagster's log" in console, console
    assert " - DEBUG - " not in console and "RUN_START" not in console, console[-3000:]
    assert " - DEBUG - " in dagster_log  # the run workers' event lines went to the log file
    for warning in ("will not be used", "is superseded"):
        assert warning not in console and warning not in dagster_log, warning


def spawn_args() -> list[str]:
    from cdc_pipeline_tests.processes import CLI
    return [CLI]
