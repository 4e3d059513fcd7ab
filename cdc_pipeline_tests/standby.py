"""A primary and a physical standby (`pg_basebackup -R`) from the same binaries, for failover and
standby-source tests.

Traps met building this topology (issue 33), each handled here:
- `synchronized_standby_slots` is set on the primary only after `pg_basebackup` (`sync_slots=True`), or the
  standby inherits it through postgresql.auto.conf and, once promoted, waits for a slot it lacks;
- slot sync needs `dbname=` in the standby's `primary_conninfo` (the one `-R` writes has none), and the
  standby needs `wal_level=logical` (inherited) and `hot_standby_feedback=on`;
- the standby's copy of a failover slot stays `temporary` until the primary's slot is consumed past the
  standby's replay point: `wait_slot_synced` waits for `synced AND NOT temporary`, calling
  `pg_log_standby_snapshot()` on the primary to speed it up.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import sql

from cdc_pipeline.postgres import embedded
from cdc_pipeline_tests.helpers import wait_until
from cdc_pipeline_tests.pg_versions import bin_dir, new_cluster

PHYSICAL_SLOT = "standby1"


@dataclass
class Pair:
    primary: embedded.EmbeddedPostgres
    standby: embedded.EmbeddedPostgres
    major: int

    def multi_host_dsn(self, dbname: str) -> str:
        """libpq's multi-host URI, read-write only: whichever of the two is the primary."""
        p, s = self.primary, self.standby
        return (f"postgresql://{p.user}@127.0.0.1:{p.port},127.0.0.1:{s.port}/{dbname}"
                "?target_session_attrs=read-write")


def start_standby(primary: embedded.EmbeddedPostgres, major: int | None,
                  sync_slots: bool = False) -> embedded.EmbeddedPostgres:
    """A hot standby of `primary` streaming through the physical slot `standby1`; with `sync_slots`
    (PostgreSQL 17+) it synchronizes failover slots and the primary waits for it before logical
    walsenders send (synchronized_standby_slots)."""
    standby = embedded.create(bin_dir=bin_dir(major))
    standby._run(standby.bin("pg_basebackup"), "-D", str(standby.data_dir), "-R", "-X", "stream",
                 "-C", "-S", PHYSICAL_SLOT, "-h", str(primary.socket_dir), "-p", str(primary.port),
                 "-U", primary.user)
    conninfo = f"host={primary.socket_dir} port={primary.port} user={primary.user} dbname=postgres"
    extra = {"unix_socket_directories": f"'{standby.socket_dir}'", "hot_standby_feedback": "on",
             "primary_conninfo": f"'{conninfo}'", "primary_slot_name": f"'{PHYSICAL_SLOT}'"}
    if sync_slots:
        extra["sync_replication_slots"] = "on"
    # postgresql.auto.conf (written by -R) wins over postgresql.conf: append there, the last line wins.
    with open(standby.data_dir / "postgresql.auto.conf", "a") as conf:
        conf.writelines(f"{k} = {v}\n" for k, v in extra.items())
    standby.start(durable=False)
    if sync_slots:
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronized_standby_slots = '{PHYSICAL_SLOT}'")
            conn.execute("SELECT pg_reload_conf()")
    wait_caught_up(primary, standby)
    return standby


@contextmanager
def primary_and_standby(major: int, sync_slots: bool = False, **settings: str) -> Iterator[Pair]:
    """A fresh primary (with `settings`) and its standby, both removed afterwards."""
    primary = new_cluster(major, **settings)
    standby: embedded.EmbeddedPostgres | None = None
    try:
        standby = start_standby(primary, major, sync_slots)
        yield Pair(primary, standby, major)
    finally:
        if standby is not None:
            standby.destroy()
        primary.destroy()


def lsn(dsn: str, query: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT ({query}) - '0/0'::pg_lsn").fetchone()
    assert row is not None and row[0] is not None
    return int(row[0])


def wait_caught_up(primary: embedded.EmbeddedPostgres, standby: embedded.EmbeddedPostgres) -> None:
    """The standby has replayed everything the primary had written when called."""
    target = lsn(primary.dsn(), "pg_current_wal_lsn()")
    wait_until(lambda: lsn(standby.dsn(), "coalesce(pg_last_wal_replay_lsn(), '0/0')") >= target,
               what="the standby to replay the primary's WAL")


def wait_slot_synced(primary: embedded.EmbeddedPostgres, standby: embedded.EmbeddedPostgres, slot: str,
                     dbname: str = "postgres", consume: bool = False) -> None:
    """The standby holds a usable (synced, not temporary) copy of the failover slot `slot`. The primary's
    slot must move past the standby's catalog xmin first: a running drain moves it (its heartbeats), else
    `consume` reads the slot on the primary here (pg_logical_slot_get_changes)."""

    def synced() -> bool:
        with psycopg.connect(primary.dsn(dbname), autocommit=True) as conn:
            conn.execute("SELECT pg_log_standby_snapshot()")
            if consume:
                conn.execute("SELECT count(*) FROM pg_logical_slot_get_changes(%s, NULL, NULL)", (slot,))
        with psycopg.connect(standby.dsn(), autocommit=True) as conn:
            row = conn.execute("SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = %s",
                               (slot,)).fetchone()
        return bool(row and row[0])

    wait_until(synced, what=f"the standby's copy of slot {slot} to be synced and not temporary")


def promote(standby: embedded.EmbeddedPostgres) -> None:
    standby._run(standby.bin("pg_ctl"), "-D", str(standby.data_dir), "-w", "promote")


def create_source(primary: embedded.EmbeddedPostgres, big_rows: int, dbname: str = "src") -> None:
    """The source database both topologies' tests use: `acct` (written while the test runs) and `big`
    (``big_rows`` rows, for a backfill)."""
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    with psycopg.connect(primary.dsn(dbname), autocommit=True) as conn:
        conn.execute("CREATE TABLE acct (id integer PRIMARY KEY, ver integer NOT NULL, note text)")
        conn.execute("CREATE TABLE big (id integer PRIMARY KEY, v text)")
        conn.execute("INSERT INTO big SELECT g, 'v' || g FROM generate_series(1, %s) g", (big_rows,))
