"""The shared budget: one row per API source in the state database, so every process syncing the
source takes its slots from the same schedule (row lock + the pure core in budget.py). Times come from
the database's clock, so processes on different machines agree."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from psycopg import sql

from cdc_pipeline.api_sync.budget import BudgetState, Quota, hint_from_headers, pause, reserve
from cdc_pipeline.config.api_sources import RateLimitConfig
from cdc_pipeline.postgres import session

_NOW = "extract(epoch FROM clock_timestamp())::float8"


class SharedBudget:
    def __init__(self, dsn: str, schema: str, source: str, rate_limit: RateLimitConfig,
                 sleep: Callable[[float], bool] | None = None) -> None:
        self.source = source
        self.configured = Quota(rate_limit.requests, rate_limit.per_seconds, rate_limit.share)
        self.max_pause = rate_limit.max_retry_after_seconds
        self._conn = session.connect(dsn, autocommit=True, application_name="cdc_pipeline api-sync")
        self._s = sql.Identifier(schema)
        self._lock = threading.Lock()
        self._sleep = sleep or (lambda s: time.sleep(s) or True)
        self._calls = 0
        self._conn.execute(sql.SQL("INSERT INTO {}.api_sync_budget (source) VALUES (%s) ON CONFLICT DO NOTHING")
                           .format(self._s), (source,))

    def close(self) -> None:
        self._conn.close()

    def quota(self) -> Quota:
        """The quota in force: the configured one, or the API's own when it reports a smaller one."""
        row = self._conn.execute(sql.SQL("SELECT quota_requests, quota_seconds FROM {}.api_sync_budget "
                                         "WHERE source = %s").format(self._s), (self.source,)).fetchone()
        return self._effective(row[0], row[1]) if row else self.configured

    def _effective(self, requests: int | None, seconds: float | None) -> Quota:
        if not requests or not seconds:
            return self.configured
        reported = Quota(requests, seconds, self.configured.share)
        rate = reported.budget / reported.seconds
        return reported if rate < self.configured.budget / self.configured.seconds else self.configured

    def acquire(self, collection: str) -> bool:
        """Wait for our slot; False when told to stop while waiting. The request must be sent at once."""
        while True:
            start, now = self._reserve(collection)
            offset = now - time.time()  # DB clock minus ours
            wait = start - now
            if wait > 0 and not self._sleep(wait):
                return False
            # Woken too late (a loaded machine): sending now could crowd the next window, so the slot is
            # given up (unused budget is safe) and a new one taken.
            if time.time() + offset - start <= self.configured.guard / 2:
                return True

    def _reserve(self, collection: str) -> tuple[float, float]:
        with self._lock, self._conn.transaction():
            row = self._conn.execute(sql.SQL(
                f"SELECT next_slot, paused_until, factor, quota_requests, quota_seconds, {_NOW} "
                "FROM {}.api_sync_budget WHERE source = %s FOR UPDATE").format(self._s), (self.source,)).fetchone()
            assert row is not None
            state = BudgetState(row[0], row[1], row[2])
            now = row[5]
            state, start = reserve(state, now, self._effective(row[3], row[4]), self.max_pause)
            self._conn.execute(sql.SQL(
                "UPDATE {}.api_sync_budget SET next_slot = %s, paused_until = %s, requests = requests + 1, "
                "updated_at = now() WHERE source = %s").format(self._s),
                (state.next_slot, state.paused_until, self.source))
            self._conn.execute(sql.SQL("INSERT INTO {}.api_sync_requests (source, collection, at) "
                                       "VALUES (%s, %s, %s)").format(self._s), (self.source, collection, start))
            self._calls += 1
            if self._calls % 200 == 0:  # the request log serves the "used / budget" figures: keep an hour
                self._conn.execute(sql.SQL("DELETE FROM {}.api_sync_requests WHERE source = %s AND at < %s")
                                   .format(self._s), (self.source, now - 3600))
            return start, now

    def pause(self, seconds: float, throttled: bool = False) -> None:
        """Everybody syncing this source waits ``seconds`` (429 Retry-After, exhausted quota)."""
        with self._lock, self._conn.transaction():
            row = self._conn.execute(sql.SQL(
                f"SELECT paused_until, {_NOW} FROM {{}}.api_sync_budget WHERE source = %s FOR UPDATE")
                .format(self._s), (self.source,)).fetchone()
            assert row is not None
            # Held to the cap, whatever an older pause stored.
            now = row[1]
            state = pause(BudgetState(paused_until=min(row[0], now + self.max_pause)), now,
                          min(seconds, self.max_pause))
            self._conn.execute(sql.SQL(
                "UPDATE {}.api_sync_budget SET paused_until = %s, throttled = throttled + %s WHERE source = %s")
                .format(self._s), (state.paused_until, int(throttled), self.source))

    def observe(self, headers: Mapping[str, str]) -> None:
        """Adjust the shared schedule to the quota headers of a response."""
        hint = hint_from_headers(headers, self.configured)
        if hint is None:
            return
        with self._lock:
            self._conn.execute(sql.SQL(
                "UPDATE {}.api_sync_budget SET factor = %s, quota_requests = coalesce(%s, quota_requests), "
                "quota_seconds = coalesce(%s, quota_seconds) WHERE source = %s").format(self._s),
                (hint.factor, hint.quota.requests if hint.quota else None,
                 hint.quota.seconds if hint.quota else None, self.source))
        if hint.pause_seconds:
            self.pause(hint.pause_seconds)
