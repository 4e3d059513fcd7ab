"""Commit -> mirror lag at an offered load (bench/e2e.py, with the CLI or through `dagster dev`)."""

from __future__ import annotations

import random
import threading
import time
from bisect import bisect_left
from collections import defaultdict
from typing import Any

import psycopg

from bench._common import wait_quiet

LAG_DDL = """
CREATE TABLE IF NOT EXISTS public.bench_lag (id bigint, ver bigint, xid bigint);
CREATE OR REPLACE FUNCTION public.bench_lag_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.bench_lag VALUES (NEW.id, NEW.ver, txid_current() % 4294967296); RETURN NULL; END $$;
CREATE TRIGGER bench_lag AFTER INSERT OR UPDATE ON mirror.orders FOR EACH ROW EXECUTE FUNCTION public.bench_lag_log();
"""


def sink_position(state: psycopg.Connection, sink: str = "mirror") -> tuple[tuple[int, int], int]:
    row = state.execute("SELECT commit_lsn, commit_idx, delivered FROM cdc_pipeline.sink_offsets "
                        "WHERE sink = %s", (sink,)).fetchone()
    return ((int(row[0]), int(row[1])), int(row[2])) if row else ((0, -1), 0)


def log_head(state: psycopg.Connection) -> tuple[tuple[int, int], int]:
    row = state.execute("SELECT commit_lsn, commit_idx FROM cdc_pipeline.change_log "
                        "ORDER BY commit_lsn DESC, commit_idx DESC LIMIT 1").fetchone()
    count = state.execute("SELECT count(*) FROM cdc_pipeline.change_log").fetchone()
    assert count is not None
    return ((int(row[0]), int(row[1])) if row else (0, -1)), int(count[0])


def wait_until(predicate: Any, timeout: float, what: str, step: float = 0.05) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(step)
    return time.monotonic()


def table_digest(dsn: str, name: str) -> tuple[int, str]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*), md5(coalesce(string_agg(t::text, ',' ORDER BY id), '')) "
                           f"FROM {name} t").fetchone()
        assert row is not None
        return int(row[0]), str(row[1])


class OfferedLoad(threading.Thread):
    """`rate` changes/s as 100 transactions/s (half inserts of new ids, half updates of existing ids)."""

    def __init__(self, dsn: str, rate: int, seconds: float, first_id: int, ver: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rate, self.seconds = dsn, rate, seconds
        self.next_id, self.ver, self.existing = first_id, ver, first_id - 1
        self.changes = 0
        self.behind = 0.0
        self.started_at = self.ended_at = 0.0  # wall clock (time.time()), comparable with Dagster's events
        self.halt = threading.Event()  # ends the load early
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            per_txn = max(2, self.rate // 100)
            inserts = per_txn // 2
            interval = per_txn / self.rate
            rng = random.Random(7)
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                started = time.monotonic()
                self.started_at = time.time()
                n = 0
                while time.monotonic() - started < self.seconds and not self.halt.is_set():
                    due = started + n * interval
                    delay = due - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    else:
                        self.behind = max(self.behind, -delay)
                    ids = list(range(self.next_id, self.next_id + inserts))
                    self.next_id += inserts
                    upd = rng.sample(range(1, self.existing), per_txn - inserts)
                    self.ver += 1
                    with conn.transaction():
                        conn.execute("INSERT INTO orders (id, account, amount, status, ver) "
                                     "SELECT i, i %% 1000, 10.5, 'new', %s FROM unnest(%s::bigint[]) i", (self.ver, ids))
                        conn.execute("UPDATE orders SET ver = %s, amount = amount + 1, status = 'paid', "
                                     "updated_at = now() WHERE id = ANY(%s)", (self.ver, upd))
                    self.changes += per_txn
                    n += 1
                self.ended_at = time.time()
        except BaseException as exc:
            self.error = exc

    @property
    def achieved(self) -> float:
        """Changes committed per second of the load's own wall time (what the source really took)."""
        return self.changes / max(1e-9, self.ended_at - self.started_at)



def measure_lag(src: str, dst: str, state: psycopg.Connection, rate: int, seconds: float, first_id: int,
                quiet: float = 0) -> tuple[list[float], OfferedLoad]:
    """Offers `rate` changes/s for `seconds` and returns the sorted lags of every change (and the load)."""
    with psycopg.connect(dst, autocommit=True) as conn:
        conn.execute(LAG_DDL)
    head, _ = log_head(state)
    if quiet:
        print(f"CPUs {100 * wait_quiet(quiet):.0f}% busy before the lag phase")
    load = OfferedLoad(src, rate, seconds, first_id=first_id, ver=10)
    load.join()
    if load.error:
        raise load.error
    with psycopg.connect(src, autocommit=True) as conn:
        end_lsn = conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint").fetchone()[0]  # type: ignore[index]

    def logged() -> bool:
        row = state.execute("SELECT committed_lsn FROM cdc_pipeline.slot_progress").fetchone()
        return bool(row and row[0] >= end_lsn)

    wait_until(logged, 600, "the drain to catch up")
    last, _ = log_head(state)
    wait_until(lambda: sink_position(state)[0] >= last, 600, "the mirror to catch up")
    changes = state.execute(
        "SELECT (pk::jsonb->>0)::bigint, (record->>'ver')::bigint, extract(epoch FROM commit_ts), "
        "extract(epoch FROM pg_xact_commit_timestamp(xmin)) "
        "FROM cdc_pipeline.change_log WHERE (commit_lsn, commit_idx) > (%s, %s)", head).fetchall()
    # The capture part of each lag: source commit -> the drain's commit of it to the log (the state database is
    # in the same cluster, whose track_commit_timestamp gives both); None where it is elsewhere.
    logged_in = sorted(float(c[3]) - float(c[2]) for c in changes if c[3] is not None)
    if logged_in:
        print(f"capture part (source commit -> log commit): p50 {1000 * logged_in[len(logged_in) // 2]:.0f} ms, "
              f"p99 {1000 * logged_in[int(len(logged_in) * 0.99)]:.0f} ms")
    with psycopg.connect(dst, autocommit=True) as conn:
        writes = conn.execute("SELECT id, ver, extract(epoch FROM pg_xact_commit_timestamp(xid::text::xid)) "
                              "FROM public.bench_lag").fetchall()
    by_id: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for i, v, ts in writes:
        by_id[i].append((v, float(ts)))
    lags: list[float] = []
    for i, v, ts, _ in changes:
        seen = sorted(by_id.get(i, []))
        k = bisect_left(seen, (v, float("-inf")))
        if k == len(seen):
            raise AssertionError(f"change of id {i} ver {v} never reached the mirror")
        lags.append(min(t for _, t in seen[k:]) - float(ts))
    lags.sort()
    return lags, load
