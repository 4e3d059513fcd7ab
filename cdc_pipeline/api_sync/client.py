"""HTTP to the API: auth from environment variables, every request through the shared budget, 429 and
Retry-After honoured for everybody, quota headers fed back, transient failures retried with backoff.
Tokens never appear in errors or logs."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import httpx

from cdc_pipeline.api_sync.budget import retry_after_seconds
from cdc_pipeline.api_sync.budget_store import SharedBudget
from cdc_pipeline.config import redact
from cdc_pipeline.config.api_sources import ApiSourceConfig, BearerAuth, OAuthClientCredentials

log = logging.getLogger(__name__)


class ApiError(RuntimeError):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(redact(message))
        self.status = status


class Stopped(Exception):
    """The sync was asked to stop while waiting for its slot."""


class ApiClient:
    def __init__(self, source: ApiSourceConfig, budget: SharedBudget, stop: threading.Event,
                 environ: Mapping[str, str] | None = None) -> None:
        self.source = source
        self.budget = budget
        self.stop = stop
        self.env = os.environ if environ is None else environ
        self.base_url = source.base_url
        self._token: str | None = None
        self._http = httpx.Client(timeout=source.request_timeout_seconds, follow_redirects=False)
        self.token_refreshes = 0
        self.budget_requests = 0  # requests sent (each took a budget slot)
        self.last_sent_at = datetime.now(UTC)  # when the latest request left (after its slot came)

    def close(self) -> None:
        self._http.close()

    def _secret(self, name: str) -> str:
        value = self.env.get(name)
        if not value:
            raise ApiError(f"api source {self.source.name}: environment variable {name} is not set")
        return value

    def _authorization(self) -> dict[str, str]:
        auth = self.source.auth
        if auth is None:
            return {}
        if isinstance(auth, BearerAuth):
            return {"Authorization": f"Bearer {self._secret(auth.token_env)}"}
        if self._token is None:
            self._refresh(auth)
        return {"Authorization": f"Bearer {self._token}"}

    def _refresh(self, auth: OAuthClientCredentials) -> None:
        """OAuth2 client credentials: a new access token (and Salesforce's instance_url)."""
        url = auth.token_url or f"{self.source.base_url}/services/oauth2/token"
        data = {"grant_type": "client_credentials", "client_id": self._secret(auth.client_id_env),
                "client_secret": self._secret(auth.client_secret_env)}
        for attempt in range(self.source.max_retries + 1):
            try:
                resp = self._http.post(url, data=data)
            except httpx.TransportError as exc:
                self._backoff(attempt, f"token endpoint unreachable ({type(exc).__name__})")
                continue
            if resp.status_code >= 500 or resp.status_code == 429:
                self._backoff(attempt, f"token endpoint answered {resp.status_code}")
                continue
            if resp.status_code != 200:
                # The body may echo the client id; say only what failed.
                raise ApiError(f"api source {self.source.name}: OAuth token request refused "
                               f"({resp.status_code})", resp.status_code)
            body = resp.json()
            self._token = body["access_token"]
            self.base_url = (body.get("instance_url") or self.source.base_url).rstrip("/")
            self.token_refreshes += 1
            return
        raise ApiError(f"api source {self.source.name}: OAuth token endpoint failed {self.source.max_retries + 1} times")

    def _backoff(self, attempt: int, why: str) -> None:
        delay = min(30.0, 0.5 * 2**attempt)
        log.warning("api source %s: %s; retrying in %.1f s", self.source.name, why, delay)
        if self.stop.wait(delay):
            raise Stopped()

    def request(self, collection: str, method: str, path: str, params: Mapping[str, Any] | None = None,
                json: Any = None) -> Any:
        """One API call through the budget; returns the decoded JSON body."""
        url = path if path.startswith(("http://", "https://")) else f"{self.base_url}{path}"
        refreshed = False
        failures = 0  # 429s are not failures: they wait as long as the API says, however often
        while True:
            if failures > self.source.max_retries:
                raise ApiError(f"api source {self.source.name}: {method} {path} failed {failures} times")
            headers = self._authorization()
            if not self.budget.acquire(collection):
                raise Stopped()
            self.budget_requests += 1
            self.last_sent_at = datetime.now(UTC)
            try:
                resp = self._http.request(method, url, params=params, json=json, headers=headers)
            except httpx.TransportError as exc:
                self._backoff(failures, f"{method} {path} failed ({type(exc).__name__})")
                failures += 1
                continue
            self.budget.observe(resp.headers)
            if resp.status_code == 429:
                wait = retry_after_seconds(resp.headers.get("retry-after"), time.time(), default=5.0)
                log.warning("api source %s: 429 on %s; everybody waits %.1f s", self.source.name, path, wait)
                self.budget.pause(wait, throttled=True)
                continue
            if resp.status_code == 401 and isinstance(self.source.auth, OAuthClientCredentials) and not refreshed:
                self._refresh(self.source.auth)  # expired session: one new token, then the same request
                refreshed = True
                continue
            if resp.status_code >= 500:
                self._backoff(failures, f"{method} {path} answered {resp.status_code}")
                failures += 1
                continue
            if resp.status_code >= 400:
                raise ApiError(f"api source {self.source.name}: {method} {path} answered {resp.status_code}: "
                               f"{resp.text[:200]}", resp.status_code)
            return resp.json()
