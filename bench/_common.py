"""Shared pieces of the benchmarks: a dedicated throwaway cluster, the real CLI, peak-RSS watching."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import yaml

from cdc_pipeline.postgres import embedded

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
CLI = str(VENV_BIN / "cdc-pipeline") if (VENV_BIN / "cdc-pipeline").exists() else "cdc-pipeline"
PG_BIN = embedded.PG_BIN
MB = 1024 * 1024


def start_cluster(durable: bool, extra: dict[str, str] | None = None) -> embedded.EmbeddedPostgres:
    """A dedicated cluster for one benchmark run. `extra` settings are applied with ALTER SYSTEM and a
    restart (some, like track_commit_timestamp, need one)."""
    cluster = embedded.create()
    cluster.start(durable=durable)
    settings = {"max_wal_size": "8GB", "checkpoint_timeout": "30min", **(extra or {})}
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        for key, value in settings.items():
            conn.execute(f"ALTER SYSTEM SET {key} = '{value}'")
    cluster.stop()
    cluster.start(durable=durable)
    return cluster


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    pg = subprocess.run([str(PG_BIN / "postgres"), "--version"], capture_output=True, text=True).stdout.strip()
    return f"{os.cpu_count()} CPUs ({cpu}), {platform.python_implementation()} {platform.python_version()}, {pg}"


def cpu_busy(seconds: float = 2.0) -> float:
    """Fraction of all CPUs busy over `seconds` (from /proc/stat)."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return 1 - (i1 - i0) / max(1, t1 - t0)


def wait_quiet(max_wait: float, threshold: float = 0.1) -> float:
    """This machine is shared: wait (up to `max_wait` s) until other work leaves the CPUs nearly idle.
    Returns the busy fraction seen last, for the record."""
    deadline = time.monotonic() + max_wait
    busy = cpu_busy()
    while busy > threshold and time.monotonic() < deadline:
        busy = cpu_busy()
    return busy


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def spawn(config: Path, *args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 - the child keeps it
    return subprocess.Popen([CLI, "--config", str(config), *args], stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def run_cli(config: Path, *args: str) -> str:
    proc = subprocess.run([CLI, "--config", str(config), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"cdc-pipeline {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def current_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint").fetchone()
        assert row is not None
        return int(row[0])


def lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


class PeakRss(threading.Thread):
    """The kernel's high-water mark (VmHWM) of one process, read until it exits. VmHWM belongs to the
    exec'd image only (ru_maxrss would include the forking parent's pages)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.start()

    def run(self) -> None:
        path = f"/proc/{self.pid}/status"
        while True:
            try:
                with open(path) as f:
                    hwm = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")), None)
            except (FileNotFoundError, ProcessLookupError):
                return
            if hwm is None:  # a zombie: exited
                return
            self.peak = max(self.peak, hwm)
            time.sleep(0.01)


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def keep_or_destroy(cluster: embedded.EmbeddedPostgres, keep: bool) -> None:
    if keep:
        print(f"cluster kept at {cluster.root} ({cluster.dsn()})")
    else:
        cluster.destroy()
        shutil.rmtree(cluster.root, ignore_errors=True)


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a live process, of its children it has reaped (a server's ended
    backends) and of its live descendants (a JVM under a deliverer): a load-independent cost of its work."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
    ticks, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = _stat(p)
        except (FileNotFoundError, ProcessLookupError):
            continue
        ticks += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        todo += parents.get(p, [])
    return ticks / os.sysconf("SC_CLK_TCK")
