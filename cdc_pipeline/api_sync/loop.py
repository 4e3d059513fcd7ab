"""The sync: per API source, its collections in turn, one request per turn through the shared budget.

A collection starts with a backfill (all history, keyset-paged by modification time, checkpointed after
every page so a killed process resumes at the last page), then polls for records modified since its
cursor. Each page's rows and its checkpoint commit together when the destination is the state database
(else rows first: a page written twice is a no-op). Two processes syncing one source split its
collections (an advisory lock per collection) and share its budget.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
from psycopg import sql

from cdc_pipeline.api_sync import checkpoint, writer
from cdc_pipeline.api_sync.adapters import Adapter, build_adapter
from cdc_pipeline.api_sync.budget_store import SharedBudget
from cdc_pipeline.api_sync.client import (
    ApiClient,
    ApiError,
    PermanentApiError,
    Stopped,
    Waiter,
    missing_secrets,
)
from cdc_pipeline.api_sync.schema import ensure_api_schema
from cdc_pipeline.config import ConfigError, PipelineConfig, redact
from cdc_pipeline.config.api_sources import ApiCollectionConfig, ApiSourceConfig
from cdc_pipeline.postgres import session

log = logging.getLogger(__name__)


@dataclass
class SyncStats:
    requests: int = 0
    records: int = 0
    deleted: int = 0
    failures: int = 0  # turns that failed (the collection cooled down)
    seconds: float = 0.0
    collections: list[str] = field(default_factory=list)


@dataclass
class _Runner:
    coll: ApiCollectionConfig
    cp: checkpoint.Checkpoint
    idle: bool = False
    cooldown_until: float = 0.0
    failures: int = 0
    sweep: dict | None = None  # a delete check in progress: its page state, ids seen, start time
    # Ids the last full sweep missed: deleted only when the next sweep (started at once) misses them too,
    # since a delete on a page already read shifts an offset-paged listing past a row that exists.
    suspects: set[str] = field(default_factory=set)


def _now() -> datetime:
    return datetime.now(UTC)


class SourceSync:
    def __init__(self, config: PipelineConfig, source: ApiSourceConfig, stop: threading.Event,
                 collections: list[str] | None = None) -> None:
        self.config, self.source, self.stop = config, source, stop
        self.schema = config.state.schema_name
        wanted = collections or [c.name for c in source.collections]
        self.collections = [source.collection(n) for n in wanted]
        self.stats = SyncStats()
        self.worker = uuid.uuid4().hex
        # Read live by /readyz (ops/): the client retrying a request, the collections cooling down.
        self.client: ApiClient | None = None
        self.owned: dict[str, _Runner] = {}

    def run(self, until_idle: bool = False, deadline: float | None = None) -> SyncStats:
        started = time.monotonic()
        dest_dsn = self.source.dsn or self.config.source.dsn
        with session.connect(self.config.state_dsn, autocommit=True, application_name="cdc_pipeline api-sync") as state:
            ensure_api_schema(state, self.schema)
            dest = state if dest_dsn == self.config.state_dsn else session.connect(dest_dsn, autocommit=True,
                                                                                 application_name="cdc_pipeline api-sync")
            waiter = Waiter(self.stop, deadline)  # no wait (slot, pause, backoff) outlives --seconds
            budget = SharedBudget(self.config.state_dsn, self.schema, self.source.name, self.source.rate_limit,
                                  sleep=waiter.wait)
            client = self.client = ApiClient(self.source, budget, waiter)
            try:
                for coll in self.collections:
                    writer.ensure_table(dest, coll)
                self._loop(state, dest, client, until_idle, deadline)
            finally:
                state.execute(sql.SQL("DELETE FROM {}.api_sync_workers WHERE source = %s AND worker = %s")
                              .format(sql.Identifier(self.schema)), (self.source.name, self.worker))
                client.close()
                budget.close()
                if dest is not state:
                    dest.close()
        self.stats.seconds = time.monotonic() - started
        return self.stats

    def _claim(self, state: psycopg.Connection, owned: dict[str, _Runner]) -> None:
        """Hold a fair share of the collections: ceil(n / live processes), each under an advisory lock,
        so processes started together split the work and one that dies leaves its share to the others."""
        s = sql.Identifier(self.schema)
        state.execute(sql.SQL(
            "INSERT INTO {}.api_sync_workers (source, worker, pid) VALUES (%s, %s, pg_backend_pid()) "
            "ON CONFLICT (source, worker) DO UPDATE SET heartbeat_at = now()").format(s),
            (self.source.name, self.worker))
        # A process is alive while its state connection is (a killed process's backend goes with it).
        state.execute(sql.SQL(
            "DELETE FROM {}.api_sync_workers w WHERE source = %s "
            "AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.pid)").format(s), (self.source.name,))
        row = state.execute(sql.SQL(
            "SELECT count(*) FROM {}.api_sync_workers w WHERE source = %s "
            "AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.pid)").format(s),
            (self.source.name,)).fetchone()
        target = -(-len(self.collections) // max(1, int(row[0]) if row else 1))
        while len(owned) > target:
            name = next(reversed(owned))
            state.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (self._lock_key(name),))
            del owned[name]
        for coll in self.collections:
            if len(owned) >= target:
                break
            if coll.name in owned:
                continue
            row = state.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                                (self._lock_key(coll.name),)).fetchone()
            if row and row[0]:
                owned[coll.name] = _Runner(coll, checkpoint.load(state, self.schema, self.source, coll))
                if coll.name not in self.stats.collections:
                    self.stats.collections.append(coll.name)

    def outages(self) -> list[str]:
        """Why this source is not syncing now: a request being retried, collections cooling down after a
        failure (empty when it syncs; a 429's pause is the API's pace, not an outage)."""
        reasons = [f"api source {self.source.name}: retrying: {self.client.outage}"] \
            if self.client is not None and self.client.outage else []
        now = time.monotonic()
        reasons += [f"api source {self.source.name}, collection {r.coll.name}: {r.cp.last_error}"
                    for r in list(self.owned.values()) if r.cooldown_until > now and r.cp.last_error]
        return reasons

    def _lock_key(self, collection: str) -> str:
        return f"cdc_pipeline.api_sync:{self.schema}:{self.source.name}:{collection}"

    def _loop(self, state: psycopg.Connection, dest: psycopg.Connection, client: ApiClient, until_idle: bool,
              deadline: float | None) -> None:
        """Rounds: every ready collection polls once, then at most ONE page of a delete check (the
        collection whose check is running, else the longest overdue), so a sweep of any length adds one
        request per round and never holds a collection's polls back (the max lag in lag.py counts it)."""
        adapter = build_adapter(self.source, client)
        owned = self.owned = {}  # this run's: locks held by its state session
        while not self.stop.is_set() and (deadline is None or time.monotonic() < deadline):
            self._claim(state, owned)
            if until_idle and not owned:
                return  # another process syncs these collections: nothing to wait for here
            ready = [r for r in owned.values() if r.cooldown_until <= time.monotonic()]
            if not ready:
                self.stop.wait(0.5)
                continue
            for r in ready:
                if not self._guarded(r, client, state, lambda r=r: self._turn(r, adapter, state, dest), deadline):
                    return
            sweeper = self._next_sweep(ready)
            if sweeper is not None and not self._guarded(
                    sweeper, client, state, lambda s=sweeper: self._sweep(s, adapter, state, dest), deadline):
                return
            if until_idle and owned and all(r.idle and not self._sweep_due(r) for r in owned.values()):
                return

    def _guarded(self, r: _Runner, client: ApiClient, state: psycopg.Connection, work: Callable[[], object],
                 deadline: float | None) -> bool:
        """One request's work for a collection; False when the sync must stop. A failure cools the
        collection down (its error in last_error) while the others go on; a permanent one ends the run."""
        if self.stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
            return False
        before = client.budget_requests
        try:
            work()
            r.failures = 0
        except Stopped:
            return False
        except PermanentApiError as exc:  # stop with the fix; status shows it too
            r.cp.last_error = redact(f"{type(exc).__name__}: {exc}")[:500]
            checkpoint.save(state, self.schema, r.cp)
            raise
        except (ApiError, httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            r.failures += 1
            self.stats.failures += 1
            r.idle = False
            r.cooldown_until = time.monotonic() + min(300.0, 2.0 * 2 ** min(r.failures, 8))
            r.cp.last_error = redact(f"{type(exc).__name__}: {exc}")[:500]
            log.error("api source %s, collection %s: %s", self.source.name, r.coll.name, r.cp.last_error)
            checkpoint.save(state, self.schema, r.cp)
        finally:
            sent = client.budget_requests - before
            r.cp.requests += sent
            self.stats.requests += sent
        return True

    def _sweep_due(self, r: _Runner) -> bool:
        if r.cp.phase != "sync":
            return False
        last = r.cp.last_delete_check_at
        return (r.sweep is not None or bool(r.suspects) or last is None
                or _now() - last > timedelta(seconds=self.source.delete_check_seconds))

    def _next_sweep(self, ready: list[_Runner]) -> _Runner | None:
        """The running delete check first (one at a time), else the one overdue the longest."""
        due = [r for r in ready if self._sweep_due(r) and r.cooldown_until <= time.monotonic()]
        running = [r for r in due if r.sweep is not None]
        if running:
            return running[0]
        oldest = datetime.min.replace(tzinfo=UTC)
        return min(due, key=lambda r: r.cp.last_delete_check_at or oldest, default=None)

    def _turn(self, r: _Runner, adapter: Adapter, state: psycopg.Connection, dest: psycopg.Connection) -> None:
        cp, coll = r.cp, r.coll
        if cp.phase == "backfill" and cp.backfill_total is None and adapter.supports_total and not cp.state:
            cp.backfill_total = adapter.total(coll)  # for the progress figure; one request, once
            checkpoint.save(state, self.schema, cp)
            return
        page = adapter.fetch(coll, cp.state)
        # The poll's snapshot is as of when its request left, not when it began waiting for its slot.
        started, finished = adapter.client.last_sent_at, _now()
        with dest.transaction(), (state.transaction() if state is not dest else nullcontext()):
            changed = writer.upsert(dest, coll, adapter, page.records)
            deleted = writer.delete(dest, coll, page.deleted)
            cp.state = page.state
            cp.records_synced += changed
            cp.records_deleted += deleted
            cp.last_error = None
            if cp.phase == "backfill":
                cp.backfill_records += len(page.records)
            if page.caught_up:
                if cp.phase == "backfill":
                    log.info("api source %s, collection %s: backfill done (%d records)", self.source.name,
                             coll.name, cp.backfill_records)
                    cp.phase, cp.backfill_done_at, cp.last_delete_check_at = "sync", finished, finished
                elif cp.synced_as_of is not None:
                    # Everything changed before the previous caught-up request started is in by now.
                    checkpoint.add_lag(cp, (finished - cp.synced_as_of).total_seconds())
                cp.synced_as_of = started
            checkpoint.save(state, self.schema, cp)
        self.stats.records += changed
        self.stats.deleted += deleted
        r.idle = cp.phase == "sync" and page.caught_up and not changed and not deleted

    def _sweep(self, r: _Runner, adapter: Adapter, state: psycopg.Connection, dest: psycopg.Connection) -> bool:
        """One page of the periodic delete check; False when the API needs none (deletes come with fetch)."""
        if r.sweep is None:
            row = dest.execute("SELECT now()").fetchone()
            r.sweep = {"state": {}, "seen": set(), "started": row[0] if row else _now()}
        page = adapter.sweep(r.coll, r.sweep["state"])
        if page is None:
            r.sweep = None
            r.cp.last_delete_check_at = _now()
            return False
        r.sweep["state"] = page.state
        r.sweep["seen"].update(page.seen)
        with dest.transaction():
            deleted = writer.delete(dest, r.coll, page.deleted)
            if page.done and page.delete_unseen:
                missing = writer.unseen(dest, r.coll, r.sweep["seen"], r.sweep["started"])
                deleted += writer.delete(dest, r.coll, sorted(missing & r.suspects))
                r.suspects = missing - r.suspects
        r.cp.records_deleted += deleted
        self.stats.deleted += deleted
        if deleted:
            r.idle = False  # else its polls say (a sweep in progress keeps --until-idle going: _sweep_due)
        if page.done:
            r.sweep = None
            r.cp.last_delete_check_at = _now()
        checkpoint.save(state, self.schema, r.cp)
        return True


class ApiSync:
    """All (or one) of the config's API sources, one thread per source."""

    def __init__(self, config: PipelineConfig, source: str | None = None, collections: list[str] | None = None) -> None:
        if not config.api_sources:
            raise ConfigError(f"{config.path or 'config'}: no api_sources configured")
        sources = [config.api_source(source)] if source else list(config.api_sources)
        missing = [(s.name, name) for s in sources for name in missing_secrets(s)]
        if missing:  # a config error at start, not a request failing every few seconds forever
            raise ConfigError("\n".join(
                f"api source {s}: environment variable {name} is not set (named by its auth); "
                f"export {name}=... before running api-sync" for s, name in missing))
        self.stop_event = threading.Event()
        self.syncs = [SourceSync(config, s, self.stop_event, collections) for s in sources]

    def stop(self) -> None:
        self.stop_event.set()

    def run(self, until_idle: bool = False, seconds: float | None = None) -> dict[str, SyncStats]:
        deadline = None if seconds is None else time.monotonic() + seconds
        if len(self.syncs) == 1:
            s = self.syncs[0]
            return {s.source.name: s.run(until_idle, deadline)}
        errors: list[BaseException] = []

        def work(s: SourceSync) -> None:
            try:
                s.run(until_idle, deadline)
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others stop
                errors.append(exc)
                self.stop()

        threads = [threading.Thread(target=work, args=(s,), name=f"api-sync-{s.source.name}") for s in self.syncs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return {s.source.name: s.stats for s in self.syncs}
