"""HTTP to the API: auth from environment variables, every request through the shared budget, 429 and
Retry-After honoured for everybody (capped), quota headers fed back, transient failures retried with
backoff, refused credentials a permanent error. Tokens never appear in errors or logs."""

from __future__ import annotations

import logging
import os
import re
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


class PermanentApiError(ApiError):
    """Waiting cannot fix it (credentials refused after a refresh): the sync stops with the fix."""


class Stopped(Exception):
    """The sync was asked to stop (or reached its deadline) while waiting."""


# A response body is the API's text, not ours: `token: X` there is a credential, not an error path.
_BODY_SECRET = re.compile(r"(?i)(?P<pre>(?<![\w-])[\w-]*(?:password|passwd|pwd|secret|token|api[_-]?key|"
                          r"authorization|cookie|session[_-]?id)\s*[:=]\s*(?:(?:bearer|basic)\s+)?)"
                          r"(?P<secret>[^\s&,;'\"]+)")


def body_excerpt(text: str, limit: int = 200) -> str:
    """The start of an error response, fit for a message: secret-looking values masked."""
    return redact(_BODY_SECRET.sub(r"\g<pre>***", text[:limit]))


class Waiter:
    """Waits that end early when the sync is stopped or its run reaches its deadline (`--seconds`)."""

    def __init__(self, stop: threading.Event, deadline: float | None = None) -> None:
        self.stop = stop
        self.deadline = deadline  # time.monotonic()

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds``; False (after sleeping to the deadline) when the sync must stop instead."""
        left = self.left()
        if left is not None and seconds >= left:
            self.stop.wait(max(0.0, left))
            return False
        return not self.stop.wait(seconds)


class ApiClient:
    def __init__(self, source: ApiSourceConfig, budget: SharedBudget, waiter: Waiter,
                 environ: Mapping[str, str] | None = None) -> None:
        self.source = source
        self.budget = budget
        self.waiter = waiter
        self.env = os.environ if environ is None else environ
        self.base_url = source.base_url
        self._token: str | None = None
        self._http = httpx.Client(timeout=source.request_timeout_seconds, follow_redirects=False)
        self.token_refreshes = 0
        self.budget_requests = 0  # requests sent (each took a budget slot)
        self.last_sent_at = datetime.now(UTC)  # when the latest request left (after its slot came)
        self.outage: str | None = None  # why the latest request is being retried (/readyz), None once answered

    def close(self) -> None:
        self._http.close()

    def _secret(self, name: str) -> str:
        value = self.env.get(name)
        if not value:  # checked at start (missing_secrets); unset since
            raise PermanentApiError(f"api source {self.source.name}: environment variable {name} is not set")
        return value

    def _credentials_fix(self) -> str:
        auth = self.source.auth
        if isinstance(auth, BearerAuth):
            return f"check the token in {auth.token_env}"
        if isinstance(auth, OAuthClientCredentials):
            return f"check the client credentials in {auth.client_id_env} / {auth.client_secret_env}"
        return "the API wants credentials: configure auth"

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
                # The body may echo the client id; say only what failed. Retrying cannot help.
                raise PermanentApiError(f"api source {self.source.name}: OAuth token request refused "
                                        f"({resp.status_code}): {self._credentials_fix()}", resp.status_code)
            body = resp.json()
            self._token = body["access_token"]
            self.base_url = (body.get("instance_url") or self.source.base_url).rstrip("/")
            self.token_refreshes += 1
            return
        raise ApiError(f"api source {self.source.name}: OAuth token endpoint failed {self.source.max_retries + 1} times")

    def _backoff(self, attempt: int, why: str) -> None:
        delay = min(30.0, 0.5 * 2**attempt)
        self.outage = why
        log.warning("api source %s: %s; retrying in %.1f s", self.source.name, why, delay)
        if not self.waiter.wait(delay):
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
            left = self.waiter.left()  # a request never outlives the run's deadline by much
            timeout = self.source.request_timeout_seconds if left is None else max(1.0, min(
                left, self.source.request_timeout_seconds))
            try:
                resp = self._http.request(method, url, params=params, json=json, headers=headers, timeout=timeout)
            except httpx.TransportError as exc:
                self._backoff(failures, f"{method} {path} failed ({type(exc).__name__})")
                failures += 1
                continue
            self.budget.observe(resp.headers)
            if resp.status_code == 429:
                cap = self.source.rate_limit.max_retry_after_seconds
                wait = retry_after_seconds(resp.headers.get("retry-after"), time.time(), default=5.0, cap=cap)
                log.warning("api source %s: 429 on %s; everybody waits %.1f s (Retry-After, at most %g s)",
                            self.source.name, path, wait, cap)
                self.budget.pause(wait, throttled=True)
                continue
            if resp.status_code == 401 and isinstance(self.source.auth, OAuthClientCredentials) and not refreshed:
                self._refresh(self.source.auth)  # expired session: one new token, then the same request
                refreshed = True
                continue
            if resp.status_code == 401:  # refused with fresh credentials: no wait will change that
                raise PermanentApiError(
                    f"api source {self.source.name}: {method} {path} answered 401 (credentials refused"
                    f"{' after a token refresh' if refreshed else ''}): {self._credentials_fix()}", 401)
            if resp.status_code >= 500:
                self._backoff(failures, f"{method} {path} answered {resp.status_code}")
                failures += 1
                continue
            if resp.status_code >= 400:
                raise ApiError(f"api source {self.source.name}: {method} {path} answered {resp.status_code}: "
                               f"{body_excerpt(resp.text)}", resp.status_code)
            self.outage = None
            return resp.json()


def missing_secrets(source: ApiSourceConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """The source's credential variables that are unset (checked at start: a config error)."""
    env = os.environ if environ is None else environ
    auth = source.auth
    names = ([auth.token_env] if isinstance(auth, BearerAuth) else
             [auth.client_id_env, auth.client_secret_env] if isinstance(auth, OAuthClientCredentials) else [])
    return [n for n in names if not env.get(n)]
