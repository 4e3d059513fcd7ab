"""Crash tests: SIGKILL the real `cdc-pipeline drain` / `deliver` processes mid-stream, restart them, and
check that nothing is lost, nothing is applied twice, and the slot never runs ahead of the change log.

The invariant checked while the drain is being killed: the server may forget a transaction only once the
log holds it. With C = the slot's confirmed_flush_lsn, every source transaction whose commit LSN is below
C must already be in the log. (The drain acknowledges a transaction's *end* LSN; a transaction committed
later has its commit record at or after that end, so "commit_lsn < C" is exactly "acknowledged".) So for
every sample: C <= slot_progress.committed_lsn (read after C), and the number of log rows with
commit_lsn < C at that moment equals that number at the end of the test, when the log is complete.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.config import PipelineConfig
from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, drain, mirror_config, wait_until

CLI = str(Path(sys.executable).with_name("cdc-pipeline"))

# Two tables, two replica identities; `ver` rises with every write of a key (each writer owns its keys),
# so "the mirror never goes backwards" is checkable from outside.
DDL = """
CREATE TABLE public.acct (id integer PRIMARY KEY, ver bigint NOT NULL, owner integer, note text);
CREATE TABLE public.evt (k text PRIMARY KEY, ver bigint NOT NULL, n integer, tags text[]);
ALTER TABLE public.evt REPLICA IDENTITY FULL;
"""
TABLES = ["public.acct", "public.evt"]


def cli(config: PipelineConfig, *args: str) -> list[str]:
    assert config.path
    return [CLI, "--config", config.path, *args]


def spawn(config: PipelineConfig, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(cli(config, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


# --------------------------------------------------------------------------------------------------
# Write load
# --------------------------------------------------------------------------------------------------


@dataclass(eq=False)  # a Thread must stay hashable
class Writer(threading.Thread):
    """One client writing inserts/updates/deletes (single-row and multi-row, both tables, key changes)
    over keys only it owns. Records the xid and change count of every transaction it commits."""

    dsn: str
    wid: int
    nwriters: int
    target: int
    rate: float | None  # changes/s; None: as fast as possible
    seed: int
    base: int = 0  # a later round of writers gets fresh keys
    txns: dict[int, int] = field(default_factory=dict)
    changes: int = 0
    error: BaseException | None = None

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name=f"writer-{self.wid}", daemon=True)
        self.rng = random.Random(self.seed)
        self.ver = 0
        self.next_id = self.base + self.wid
        self.accts: list[int] = []
        self.evts: list[str] = []
        self.next_evt = 0

    def _new_id(self) -> int:
        self.next_id += self.nwriters
        return self.next_id

    def _v(self) -> int:
        self.ver += 1
        return self.ver

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn) as conn:
                started = time.monotonic()
                while self.changes < self.target:
                    self._transaction(conn)
                    if self.rate:
                        ahead = self.changes / self.rate - (time.monotonic() - started)
                        if ahead > 0:
                            time.sleep(ahead)
        except BaseException as exc:  # reported by the test thread
            self.error = exc

    def _transaction(self, conn: psycopg.Connection) -> None:
        rng = self.rng
        row = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
        assert row is not None
        xid = int(row[0]) & 0xFFFFFFFF  # pgoutput carries the 32-bit xid
        accts, evts = list(self.accts), list(self.evts)
        n = 0
        kind = rng.random()
        if kind < 0.08 or len(accts) < 200:  # bulk insert, both tables
            ids = [self._new_id() for _ in range(rng.randint(100, 1500))]
            v = self._v()
            cur = conn.execute("INSERT INTO acct SELECT i, %s, %s, 'bulk' FROM unnest(%s::int[]) i",
                               (v, self.wid, ids))
            n += cur.rowcount
            accts += ids
            keys = [f"w{self.base + self.wid}-{self.next_evt + i}" for i in range(rng.randint(10, 200))]
            self.next_evt += len(keys)
            cur = conn.execute("INSERT INTO evt SELECT k, %s, 0, ARRAY[k, 'x'] FROM unnest(%s::text[]) k",
                               (self._v(), keys))
            n += cur.rowcount
            evts += keys
        elif kind < 0.45:  # multi-row updates
            some = rng.sample(accts, min(len(accts), rng.randint(5, 300)))
            cur = conn.execute("UPDATE acct SET ver = %s, note = md5(random()::text) WHERE id = ANY(%s)",
                               (self._v(), some))
            n += cur.rowcount
            if evts:
                some_e = rng.sample(evts, min(len(evts), rng.randint(1, 50)))
                cur = conn.execute("UPDATE evt SET ver = %s, n = n + 1 WHERE k = ANY(%s)", (self._v(), some_e))
                n += cur.rowcount
        elif kind < 0.47:  # bulk delete
            gone = set(rng.sample(accts, min(len(accts) - 100, rng.randint(50, 400))))
            cur = conn.execute("DELETE FROM acct WHERE id = ANY(%s)", (list(gone),))
            n += cur.rowcount
            accts = [i for i in accts if i not in gone]
        else:  # a few single-row statements of every kind
            for _ in range(rng.randint(1, 8)):
                op = rng.random()
                if op < 0.25:
                    i = self._new_id()
                    conn.execute("INSERT INTO acct VALUES (%s, %s, %s, NULL)", (i, self._v(), self.wid))
                    accts.append(i)
                elif op < 0.55 and accts:
                    i = rng.choice(accts)
                    conn.execute("UPDATE acct SET ver = %s, note = %s WHERE id = %s",
                                 (self._v(), f"n{self.ver}" if rng.random() < 0.8 else None, i))
                elif op < 0.62 and accts:  # primary key change
                    pos = rng.randrange(len(accts))
                    new = self._new_id()
                    conn.execute("UPDATE acct SET id = %s, ver = %s WHERE id = %s", (new, self._v(), accts[pos]))
                    accts[pos] = new
                elif op < 0.72 and len(accts) > 100:
                    i = accts.pop(rng.randrange(len(accts)))
                    conn.execute("DELETE FROM acct WHERE id = %s", (i,))
                elif op < 0.85 and evts:
                    k = rng.choice(evts)
                    conn.execute("UPDATE evt SET ver = %s, n = n + 1, tags = tags || %s WHERE k = %s",
                                 (self._v(), [str(self.ver)], k))
                elif op < 0.92 and len(evts) > 20:
                    k = evts.pop(rng.randrange(len(evts)))
                    conn.execute("DELETE FROM evt WHERE k = %s", (k,))
                else:
                    k = f"w{self.base + self.wid}-{self.next_evt}"
                    self.next_evt += 1
                    conn.execute("INSERT INTO evt VALUES (%s, %s, 1, NULL)", (k, self._v()))
                    evts.append(k)
                n += 1
        conn.commit()
        # Only a committed transaction changes what the writer owns and what the log must hold.
        self.accts, self.evts = accts, evts
        self.txns[xid] = n
        self.changes += n


def run_writers(dsn: str, target: int, rate: float | None, seed: int, nwriters: int = 2,
                base: int = 0) -> list[Writer]:
    writers = [Writer(dsn, w, nwriters, target // nwriters, rate / nwriters if rate else None, seed + w, base)
               for w in range(nwriters)]
    for w in writers:
        w.start()
    return writers


def join_writers(writers: list[Writer]) -> dict[int, int]:
    txns: dict[int, int] = {}
    for w in writers:
        w.join(timeout=120)
        assert not w.is_alive(), "writer did not finish"
        if w.error:
            raise w.error
        txns.update(w.txns)
    return txns


# --------------------------------------------------------------------------------------------------
# Observers
# --------------------------------------------------------------------------------------------------


class Watcher(threading.Thread):
    """A background check running while processes are killed; the test thread re-raises its error."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.violations: list[str] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
        if self.error:
            raise self.error


class SlotWatch(Watcher):
    """Samples (confirmed_flush_lsn C, committed_lsn, log rows with commit_lsn < C) while the drain dies."""

    def __init__(self, config: PipelineConfig) -> None:
        super().__init__("slot-watch")
        self.config = config
        self.samples: list[tuple[int, int, int]] = []

    def run(self) -> None:
        slot = self.config.source.slot
        try:
            with psycopg.connect(self.config.source.dsn, autocommit=True) as src, \
                    psycopg.connect(self.config.state_dsn, autocommit=True) as state:
                initial: int | None = None  # where the slot was created: nothing to acknowledge before it
                while not self._halt.wait(0.05):
                    row = src.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots "
                                      "WHERE slot_name = %s", (slot,)).fetchone()
                    assert row is not None
                    confirmed = int(row[0])
                    initial = confirmed if initial is None else initial
                    # Read after C: the log's state can only have grown since C was reported.
                    got = state.execute("SELECT committed_lsn FROM cdc_pipeline.slot_progress WHERE slot = %s",
                                        (slot,)).fetchone()
                    committed = int(got[0]) if got else 0
                    count = state.execute("SELECT count(*) FROM cdc_pipeline.change_log WHERE commit_lsn < %s",
                                          (confirmed,)).fetchone()
                    assert count is not None
                    if confirmed > max(committed, initial):
                        self.violations.append(f"confirmed_flush_lsn {confirmed} > log committed_lsn {committed}")
                    if self.samples and confirmed < self.samples[-1][0]:
                        self.violations.append(f"confirmed_flush_lsn went back: {self.samples[-1][0]} -> {confirmed}")
                    self.samples.append((confirmed, committed, int(count[0])))
        except BaseException as exc:
            self.error = exc

    def check_against_final_log(self) -> None:
        """Every sample's count of log rows below C must be what the complete log holds below C."""
        cs = sorted({c for c, _, _ in self.samples})
        with psycopg.connect(self.config.state_dsn) as state:
            final = dict(state.execute(
                "SELECT c, (SELECT count(*) FROM cdc_pipeline.change_log WHERE commit_lsn < c) "
                "FROM unnest(%s::bigint[]) c", (cs,)).fetchall())
        late = [(c, n, final[c]) for c, _, n in self.samples if n != final[c]]
        assert not late, f"acknowledged transactions missing from the log at the time: {late[:5]}"


class MirrorWatch(Watcher):
    """Polls the mirror: a key's `ver` never decreases, and a key that vanished never comes back with
    the version it had (that would be an old message applied again)."""

    QUERIES = {"acct": "SELECT id::text, ver FROM mirror.acct", "evt": "SELECT k, ver FROM mirror.evt"}

    def __init__(self, dsn: str) -> None:
        super().__init__("mirror-watch")
        self.dsn = dsn
        self.polls = 0

    def run(self) -> None:
        seen: dict[tuple[str, str], int] = {}
        absent: set[tuple[str, str]] = set()
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self._halt.wait(0.05):
                    now: dict[tuple[str, str], int] = {}
                    try:
                        with conn.transaction():  # one snapshot for both tables
                            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                            for table, query in self.QUERIES.items():
                                now.update(((table, k), int(v)) for k, v in conn.execute(query).fetchall())
                    except psycopg.errors.UndefinedTable:
                        continue  # the sink creates the tables with its first batch
                    self.polls += 1
                    for key, ver in now.items():
                        before = seen.get(key)
                        if before is not None and (ver < before or (ver == before and key in absent)):
                            self.violations.append(f"{key}: ver {before} -> {ver} (absent between: {key in absent})")
                        seen[key] = ver
                        absent.discard(key)
                    absent.update(k for k in seen if k not in now)
        except BaseException as exc:
            self.error = exc


# --------------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------------


def _prepare(source_db: Database, dest: Database, write_config: Callable[..., PipelineConfig],
             **extra: Any) -> PipelineConfig:
    source_db.execute(DDL)
    data = mirror_config(source_db.dsn, dest.dsn, TABLES)
    data["drain"] = {"heartbeat_seconds": 0.5, "batch_ms": 100}
    data.update(extra)
    config = write_config(data)
    setup(config)
    return config


def _log_by_xid(config: PipelineConfig) -> dict[int, int]:
    with psycopg.connect(config.state_dsn) as conn:
        return dict(conn.execute("SELECT xid, count(*) FROM cdc_pipeline.change_log GROUP BY xid").fetchall())


def _assert_log_complete(config: PipelineConfig, txns: dict[int, int]) -> None:
    """The log holds exactly the writers' committed transactions, each with all its changes, once."""
    logged = _log_by_xid(config)
    missing = {x: n for x, n in txns.items() if logged.get(x) != n}
    extra = set(logged) - set(txns)
    assert not missing, f"{len(missing)} transactions missing or incomplete in the log, e.g. " \
        f"{[(x, n, logged.get(x)) for x, n in list(missing.items())[:5]]}"
    assert not extra, f"log holds transactions no writer committed: {sorted(extra)[:5]}"


@pytest.mark.slow
@pytest.mark.pg_matrix
def test_drain_sigkill_during_100k_changes(source_db: Database, db_factory: Callable[[], Database],
                                           write_config: Callable[..., PipelineConfig], spark: Any) -> None:
    seed = int(os.environ.get("CDC_CRASH_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (rerun with CDC_CRASH_SEED={seed})")
    rng = random.Random(seed)
    dest = db_factory()
    config = _prepare(source_db, dest, write_config)
    watch = SlotWatch(config)
    watch.start()
    writers = run_writers(source_db.dsn, 100_000, rate=8_000, seed=seed)
    kills = 0
    killed_with_progress = 0
    started = time.monotonic()
    # Kill at random moments while the writers run (and at least 6 times), each drain living 0.2-2.5 s.
    while kills < 6 or any(w.is_alive() for w in writers):
        assert time.monotonic() - started < 120, "writers did not finish"
        before = watch.samples[-1][1] if watch.samples else 0
        proc = spawn(config, "drain", "--seconds", "120")
        time.sleep(rng.uniform(0.2, 2.5))
        if proc.poll() is not None:
            rc, out, err = finish(proc, 10)
            pytest.fail(f"drain exited early (rc {rc}) after a restart:\n{out}\n{err}")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        kills += 1
        killed_with_progress += (watch.samples[-1][1] if watch.samples else 0) > before
    txns = join_writers(writers)
    assert sum(txns.values()) >= 100_000

    rc, out, err = finish(spawn(config, "drain", "--until-idle", "--seconds", "120"), 150)
    assert rc == 0, f"final drain failed:\n{out}\n{err}"
    time.sleep(0.3)  # one more sample after the final acknowledgement
    watch.stop()
    print(f"{kills} kills ({killed_with_progress} after progress); {len(watch.samples)} slot samples; {out.strip()}")

    assert not watch.violations, watch.violations[:5]
    assert len({c for c, _, _ in watch.samples}) > 10, "the slot hardly moved while watched"
    watch.check_against_final_log()
    _assert_log_complete(config, txns)

    stats = deliver(config, spark)
    assert stats.parked == 0
    assert_mirrored(source_db.dsn, "public.acct", dest.dsn, "mirror.acct")
    assert_mirrored(source_db.dsn, "public.evt", dest.dsn, "mirror.evt")


def _sink_offsets(state_dsn: str, dest_dsn: str) -> tuple[tuple[int, int], tuple[int, int] | None]:
    with psycopg.connect(state_dsn, autocommit=True) as s, psycopg.connect(dest_dsn, autocommit=True) as d:
        row = s.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.sink_offsets WHERE sink = 'mirror'").fetchone()
        state = (int(row[0]), int(row[1])) if row else (0, -1)
        try:
            got = d.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline_sink.offsets WHERE sink = 'mirror'"
                            ).fetchone()
        except psycopg.errors.UndefinedTable:
            got = None
        return state, ((int(got[0]), int(got[1])) if got else None)


def _set_batch_size(config: PipelineConfig, batch_size: int) -> None:
    assert config.path
    path = Path(config.path)
    data = yaml.safe_load(path.read_text())
    data.setdefault("delivery", {})["batch_size"] = batch_size
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def _kill_when_sink_ahead_of_state(proc: subprocess.Popen[str], state_dsn: str, dest_dsn: str,
                                   timeout: float) -> None:
    """SIGKILL `proc` once the sink has committed a batch whose offset the state database has not recorded.
    That window is a few ms long, so it is held open: the test locks the state's offset row (a slow state
    database), the next batch reaches the destination and then waits on the lock; the kill lands there."""
    with psycopg.connect(state_dsn) as lock, psycopg.connect(state_dsn, autocommit=True) as s, \
            psycopg.connect(dest_dsn, autocommit=True) as d:
        lock.execute("SELECT 1 FROM cdc_pipeline.sink_offsets WHERE sink = 'mirror' FOR UPDATE")

        def sink_ahead() -> bool:
            got = d.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline_sink.offsets WHERE sink = 'mirror'"
                            ).fetchone()
            row = s.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.sink_offsets WHERE sink = 'mirror'"
                            ).fetchone()
            assert proc.poll() is None, f"deliver exited: {finish(proc, 10)}"
            return bool(got and row and tuple(got) > tuple(row))

        wait_until(sink_ahead, timeout, "the sink to commit a batch the state has not recorded")
        os.killpg(proc.pid, signal.SIGKILL)
        lock.rollback()


def _wait_for_open_sink_transaction(dest_dsn: str, dbname: str, timeout: float) -> bool:
    """Wait until some other session in the destination has a transaction open (the sink mid-batch)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dest_dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
                "AND backend_xid IS NOT NULL", (dbname,)).fetchone()
            if row and row[0]:
                return True
            time.sleep(0.002)
    return False


@pytest.mark.slow
def test_deliver_sigkill_mid_batch(source_db: Database, db_factory: Callable[[], Database],
                                   write_config: Callable[..., PipelineConfig]) -> None:
    seed = int(os.environ.get("CDC_CRASH_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (rerun with CDC_CRASH_SEED={seed})")
    rng = random.Random(seed)
    dest = db_factory()
    # Small batches: many sink transactions to land a kill in.
    config = _prepare(source_db, dest, write_config, delivery={"batch_size": 1500, "idle_seconds": 0.5})
    txns = join_writers(run_writers(source_db.dsn, 20_000, rate=None, seed=seed))
    drain(config)
    _assert_log_complete(config, txns)

    watch = MirrorWatch(dest.dsn)
    watch.start()
    # Writes keep coming while delivery is killed; a drain (not killed here) keeps the log growing.
    writers = run_writers(source_db.dsn, 6_000, rate=1_000, seed=seed + 100, base=10_000_000)
    drainer = spawn(config, "drain", "--seconds", "120")
    # Each restart costs a JVM start (~10 s here), so three kills: inside an open sink transaction, between
    # the sink's commit and the state's offset commit (held open by a lock), at random.
    modes = ["sink transaction open", "sink ahead of state", "random"]
    try:
        for mode, batch_size in zip(modes, (1200, 1500, 400), strict=True):
            # A different batch size per run: a restart then replays a *different* slice of what the
            # killed run applied, so an ignored sink offset would show as rows going backwards.
            _set_batch_size(config, batch_size)
            before = _sink_offsets(config.state_dsn, dest.dsn)
            proc = spawn(config, "deliver", "--seconds", "300")  # runs until killed
            # Let it deliver something first (the JVM takes a while to start).
            deadline = time.monotonic() + 60
            while _sink_offsets(config.state_dsn, dest.dsn) == before:
                assert proc.poll() is None, f"deliver exited early: {finish(proc, 10)}"
                assert time.monotonic() < deadline, "deliver made no progress"
                time.sleep(0.05)
            if mode == "random":
                time.sleep(rng.uniform(0.0, 1.0))
            elif mode == "sink ahead of state":
                _kill_when_sink_ahead_of_state(proc, config.state_dsn, dest.dsn, 120)
            else:
                assert _wait_for_open_sink_transaction(dest.dsn, dest.name, 20), "no sink transaction seen"
            assert proc.poll() in (None, -signal.SIGKILL), f"deliver exited: {finish(proc, 10)}"
            if proc.returncode is None:  # "sink ahead of state" killed it already: poll() may have reaped it
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            print(f"killed deliver ({mode}); offsets state/sink: {_sink_offsets(config.state_dsn, dest.dsn)}")
        txns.update(join_writers(writers))
        os.killpg(drainer.pid, signal.SIGTERM)  # graceful: commits what it has and stops
        rc, out, err = finish(drainer, 60)
        assert rc == 0, f"drain failed:\n{out}\n{err}"
        rc, out, err = finish(spawn(config, "drain", "--until-idle"), 60)
        assert rc == 0, f"drain failed:\n{out}\n{err}"
        _assert_log_complete(config, txns)

        rc, out, err = finish(spawn(config, "deliver", "--until-idle"), 120)
        assert rc == 0, f"final deliver failed:\n{out}\n{err}"
        print(out.strip())
    finally:
        if drainer.poll() is None:
            os.killpg(drainer.pid, signal.SIGKILL)
            drainer.wait(10)
    time.sleep(0.3)
    watch.stop()
    assert watch.polls > 20
    assert not watch.violations, watch.violations[:5]
    assert_mirrored(source_db.dsn, "public.acct", dest.dsn, "mirror.acct")
    assert_mirrored(source_db.dsn, "public.evt", dest.dsn, "mirror.evt")
    # The sink's own offset and the state's agree at the end, and nothing was parked.
    state_off, sink_off = _sink_offsets(config.state_dsn, dest.dsn)
    assert sink_off is not None and sink_off <= state_off
    with psycopg.connect(config.state_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM cdc_pipeline.failed_messages").fetchone()
        assert row == (0,)


def test_second_drain_on_the_same_slot_fails_clearly(source_db: Database, db_factory: Callable[[], Database],
                                                     write_config: Callable[..., PipelineConfig]) -> None:
    dest = db_factory()
    config = _prepare(source_db, dest, write_config)
    first = spawn(config, "drain", "--seconds", "60")
    try:
        deadline = time.monotonic() + 20
        while not source_db.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'cdc_test'")[0][0]:
            assert first.poll() is None, finish(first, 10)
            assert time.monotonic() < deadline, "first drain never attached to the slot"
            time.sleep(0.05)

        # Same state database: the drain's lock refuses before touching the slot.
        rc, out, err = finish(spawn(config, "drain", "--seconds", "5"), 30)
        assert rc != 0
        lines = [line for line in err.strip().splitlines() if line]
        assert len(lines) == 1, err
        assert "another drain is already running for slot 'cdc_test'" in lines[0]

        # Another state database (so no shared lock): the server's own one-consumer rule, named clearly.
        other_state = db_factory()
        data = mirror_config(source_db.dsn, dest.dsn, TABLES)
        data["state"] = {"dsn": other_state.dsn}
        other = write_config(data, name="other.yaml")
        setup(other)  # slot and publication exist already: only creates the state schema there
        rc, out, err = finish(spawn(other, "drain", "--seconds", "5"), 30)
        assert rc != 0
        lines = [line for line in err.strip().splitlines() if line]
        assert len(lines) == 1, err
        assert 'replication slot "cdc_test" is active' in lines[0], lines[0]

        # The first drain was not disturbed: it still captures, and stops cleanly on SIGTERM.
        source_db.execute("INSERT INTO acct VALUES (1, 1, 1, 'after the refused drains')")
        deadline = time.monotonic() + 20
        while not source_db.execute("SELECT count(*) FROM cdc_pipeline.change_log")[0][0]:
            assert time.monotonic() < deadline, "first drain stopped capturing"
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGTERM)
        rc, out, err = finish(first, 30)
        assert rc == 0, err
        assert "drained 1 changes" in out
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
