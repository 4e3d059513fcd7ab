"""A throwaway PostgreSQL cluster with wal_level=logical, for the demo and the tests.

PostgreSQL refuses to run as root, so when we are root the cluster is initialised and started as the
`postgres` system user. The Unix socket lives in the cluster's own folder: replication over a socket is
about twice as fast as over 127.0.0.1 on this machine.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

PG_BIN = Path(os.environ.get("CDC_PG_BIN", "/usr/lib/postgresql/15/bin"))

SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_connections": "200",
    "listen_addresses": "'127.0.0.1'",
    "shared_buffers": "256MB",
    "logical_decoding_work_mem": "64MB",
    "wal_sender_timeout": "60s",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EmbeddedPostgres:
    root: Path
    port: int
    user: str = "postgres"
    # None: trust authentication (tests, in a private mkdtemp folder); else scram-sha-256 for every
    # connection, local or TCP (the demo: another local user must not get in through 127.0.0.1).
    password: str | None = None
    # The server binaries' folder: the machine's (or CDC_PG_BIN) unless a test asks for another major version
    # (cdc_pipeline.postgres.binaries).
    bin_dir: Path = PG_BIN

    def bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root

    def dsn(self, dbname: str = "postgres", tcp: bool = False) -> str:
        host = "127.0.0.1" if tcp else str(self.socket_dir)
        secret = f" password={self.password}" if self.password else ""
        return f"host={host} port={self.port} user={self.user} dbname={dbname}{secret}"

    def url(self, dbname: str = "postgres", driver: str = "postgresql+psycopg2") -> str:
        """SQLAlchemy URL (psycopg2: dagster-postgres' NOTIFY breaks under psycopg 3)."""
        return f"{driver}://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(_as_postgres(list(args)), check=check, capture_output=True, text=True)

    def start(self, durable: bool = True, settings: dict[str, str] | None = None) -> EmbeddedPostgres:
        """Start the cluster, initialising it first if its folder holds none (then `settings`, raw
        postgresql.conf values, are written after the defaults)."""
        log = self.root / "postgres.log"
        if not (self.data_dir / "PG_VERSION").exists():
            auth = ["--auth=trust"]
            pwfile = self.root / "initdb.pw"
            if self.password:
                pwfile.write_text(self.password)
                pwfile.chmod(0o600)
                _own(pwfile)
                auth = ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
            try:
                self._run(self.bin("initdb"), "-D", str(self.data_dir), "-U", self.user,
                          *auth, "-E", "UTF8", "--locale=C.UTF-8")
            finally:
                pwfile.unlink(missing_ok=True)
            conf_lines = dict(SETTINGS, unix_socket_directories=f"'{self.socket_dir}'")
            if not durable:  # tests: crash safety of the *pipeline* is under test, not of the server
                conf_lines.update(fsync="off", synchronous_commit="off", full_page_writes="off")
            conf_lines.update(settings or {})
            with open(self.data_dir / "postgresql.conf", "a") as conf:
                conf.writelines(f"{k} = {v}\n" for k, v in conf_lines.items())
        self._run(self.bin("pg_ctl"), "-D", str(self.data_dir), "-l", str(log), "-o",
                  f"-p {self.port}", "-w", "-t", "60", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run(self.bin("pg_ctl"), "-D", str(self.data_dir), "-m", mode, "-w", "stop", check=False)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def is_running(self) -> bool:
        return self._run(self.bin("pg_ctl"), "-D", str(self.data_dir), "status", check=False).returncode == 0

    def create_database(self, name: str) -> None:
        from psycopg import sql

        from cdc_pipeline.postgres import session

        with session.connect(self.dsn(), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


def _own(path: Path) -> None:
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(path, pw.pw_uid, pw.pw_gid)


def create(root: str | os.PathLike[str] | None = None, port: int | None = None,
           password: str | None = None, bin_dir: Path | None = None) -> EmbeddedPostgres:
    """Create (but do not start) a cluster folder; reuse `root` if it already holds one. With `password`,
    the cluster authenticates with it (a cluster reused from `root` keeps the one it was made with)."""
    path = Path(root) if root else Path(tempfile.mkdtemp(prefix="cdc_pg_"))
    path.mkdir(parents=True, exist_ok=True)
    _own(path)
    port_file = path / "port"
    if port is None:
        port = int(port_file.read_text()) if port_file.exists() else _free_port()
    port_file.write_text(str(port))
    password_file = path / "password"
    if password is not None:
        if password_file.exists():
            password = password_file.read_text().strip()
        else:
            fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(password)
    return EmbeddedPostgres(root=path, port=port, password=password, bin_dir=bin_dir or PG_BIN)
