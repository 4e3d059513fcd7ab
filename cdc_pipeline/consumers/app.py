"""The pull consumers' HTTP API (FastAPI): receive with long-poll, ack, nack, per http_pull sink.

All state is in the state database (state/pull_queue.py), so any number of `serve` processes can share
it and a restart loses nothing: what was in flight comes back after its visibility timeout. Each request
is one statement on a pooled autocommit connection; consumers/fastpath.py answers well-formed, authorized
requests without FastAPI's per-request machinery and leaves every other request to it. Long-polls wait on a LISTEN channel the delivery
engine notifies when it queues messages (and a nack when it releases some), re-checking at least every
POLL_SECONDS for leases that expired.
"""

import asyncio
import contextlib
import hmac
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Annotated, Any

import psycopg
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict, Field

from cdc_pipeline.config import PipelineConfig
from cdc_pipeline.core.metrics_registry import PULL_MESSAGES, PULL_RECEIVE_SECONDS
from cdc_pipeline.postgres import session
from cdc_pipeline.sinks.http_pull.consumers import Consumer, consumers_of
from cdc_pipeline.state.pull_queue import NOTIFY_CHANNEL, PullQueue

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2  # re-check for expired leases at least this often while a long-poll waits
WAIT_LOG_SECONDS = 30.0
MAX_BATCH = 10_000
MAX_WAIT_MS = 60_000
# The largest request body read (the largest legitimate one, 10,000 ack ids, is well under it); checked
# after authentication, before reading (consumers/fastpath.py).
MAX_BODY_BYTES = 1024 * 1024


class ReceiveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_size: int = Field(default=1, ge=1, le=MAX_BATCH)
    wait_for_ms: int = Field(default=0, ge=0, le=MAX_WAIT_MS)


class ReceivedMessage(BaseModel):
    ack_id: str
    message: dict[str, Any]


class ReceiveResponse(BaseModel):
    data: list[ReceivedMessage]


class SettleRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ack_ids: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(min_length=1, max_length=MAX_BATCH)


class SettleResponse(BaseModel):
    settled: int = Field(description="how many of the ids were acknowledged (or released)")
    stale: list[str] = Field(description="ids whose lease had expired or that were handed out again since")


def authenticate(consumers: Mapping[str, Consumer], name: str, token: str | None) -> Consumer | int:
    """The token first, then the name: 401 unless the token is some consumer's (so an unauthenticated
    caller cannot tell a known name from an unknown one), 404 for an unknown name, 401 for another
    consumer's token. Every token is compared, in constant time each."""
    given = (token or "").encode()
    owner = None
    for consumer in consumers.values():
        if hmac.compare_digest(given, consumer.token.encode()) and token:
            owner = consumer
    if owner is None:
        return 401
    found = consumers.get(name)
    if found is None:
        return 404
    return found if found is owner else 401


class Wakeups:
    """One asyncio.Event per consumer, set when the delivery engine notifies that it queued messages."""

    def __init__(self, names: list[str]) -> None:
        self._events = {name: asyncio.Event() for name in names}

    def current(self, name: str) -> asyncio.Event:
        return self._events[name]

    def fire(self, name: str) -> None:
        event = self._events.get(name)
        if event is not None:
            self._events[name] = asyncio.Event()  # later waiters wait for the next notification
            event.set()

    async def listen(self, dsn: str) -> None:
        """LISTEN forever, reconnecting; without it long-polls still see messages within POLL_SECONDS."""
        while True:
            try:
                info = session.conninfo(dsn, application_name="cdc_pipeline serve listen")
                async with await psycopg.AsyncConnection.connect(info, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    log.info("listening for queued messages on channel %s", NOTIFY_CHANNEL)
                    async for note in conn.notifies():
                        self.fire(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a lost listener degrades to polling, retried
                log.warning("pull listener lost its state connection (%s); polling every %.1f s, reconnecting",
                            type(exc).__name__, POLL_SECONDS)
                await asyncio.sleep(1)


class PullService:
    """What the endpoints do, shared by the FastAPI routes and the fast path (consumers/fastpath.py).
    Response bodies are built here as bytes: stored payloads are JSON text, spliced in verbatim."""

    def __init__(self, config: PipelineConfig, consumers: dict[str, Consumer], pool_size: int = 8) -> None:
        self.consumers = consumers
        self.dsn = config.state_dsn
        self.queue = PullQueue(config.state.schema_name)
        self.wakeups = Wakeups(list(consumers))
        # The session settings every connection gets (connect timeout, keepalives): see postgres/session.py.
        self.pool = AsyncConnectionPool(session.conninfo(config.state_dsn, application_name="cdc_pipeline serve"),
                                        min_size=1, max_size=pool_size, open=False,
                                        kwargs={"autocommit": True}, name="cdc_pipeline.serve")
        # One receive statement per consumer at a time in this process: concurrent ones scan the same
        # queue head and mostly skip each other's locked rows (measured: 5-7x the time of one at a time).
        self.receiving = {name: asyncio.Lock() for name in consumers}
        self.last_wait_log: dict[str, float] = {}

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        await self.pool.open(wait=True, timeout=30)
        listener = asyncio.create_task(self.wakeups.listen(self.dsn))
        log.info("serving pull consumers: %s", ", ".join(self.consumers) or "(none configured)")
        try:
            yield
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            await self.pool.close()

    async def receive(self, who: Consumer, batch_size: int, wait_for_ms: int,
                      disconnected: Callable[[], Awaitable[bool]]) -> bytes | None:
        """The response body, or None when the client left while it waited (nothing was handed out)."""
        began = time.monotonic()
        deadline = began + wait_for_ms / 1000
        while True:
            woken = self.wakeups.current(who.name)
            # The lock first: receivers queued behind it hold no pooled connection that acks need.
            async with self.receiving[who.name], self.pool.connection() as conn:
                got = await self.queue.receive(conn, who.name, batch_size, who.visibility_timeout_ms,
                                               who.max_deliveries)
            left = deadline - time.monotonic()
            if got or left <= 0:
                break
            if await disconnected():
                PULL_RECEIVE_SECONDS.labels(who.name, "gone").observe(time.monotonic() - began)
                return None
            if time.monotonic() - self.last_wait_log.get(who.name, 0.0) >= WAIT_LOG_SECONDS:  # not per request
                self.last_wait_log[who.name] = time.monotonic()
                log.info("consumer %s: nothing ready, long-poll waiting up to %.0f ms for queued messages",
                         who.name, left * 1000)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), min(left, POLL_SECONDS))
        PULL_RECEIVE_SECONDS.labels(who.name, "messages" if got else "empty").observe(time.monotonic() - began)
        PULL_MESSAGES.labels(who.name, "received").inc(len(got))
        # Ack ids are digits and a dot: no escaping needed.
        return b'{"data":[' + ",".join(
            f'{{"ack_id":"{m.ack_id}","message":{m.payload}}}' for m in got).encode() + b"]}"

    async def settle(self, who: Consumer, ack_ids: list[str], nack: bool = False) -> bytes:
        async with self.pool.connection() as conn:
            settled, stale = await self.queue.settle(conn, who.name, ack_ids, nack=nack)
        PULL_MESSAGES.labels(who.name, "nacked" if nack else "acked").inc(settled)
        if nack and settled:
            self.wakeups.fire(who.name)
        # ASCII escapes: a fuzzed id with a lone surrogate must not fail to encode (a 500).
        return json.dumps({"settled": settled, "stale": stale}, separators=(",", ":")).encode()


def create_app(config: PipelineConfig, environ: Mapping[str, str] = os.environ,
               pool_size: int = 8) -> tuple[FastAPI, PullService]:
    """The API (routes, validation, error answers, /openapi.json) and the service behind it."""
    consumers = consumers_of(config, environ)
    service = PullService(config, consumers, pool_size)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with service.running():
            yield

    app = FastAPI(title="cdc_pipeline pull consumers", version="1", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's own answer, with ASCII escapes: its UTF-8 encoding fails (a 500) when the echoed
        # input holds a lone surrogate, which JSON's \u escapes can carry.
        body = json.dumps({"detail": jsonable_encoder(exc.errors())}, separators=(",", ":"))
        return Response(body, status_code=422, media_type="application/json")
    bearer = HTTPBearer(auto_error=False, description="the token in the consumer's token_env variable")

    async def consumer(name: str, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
                       ) -> Consumer:  # async: a plain def would cost a thread-pool hop per request
        found = authenticate(consumers, name, credentials.credentials if credentials else None)
        if found == 404:
            raise HTTPException(404, f"no http_pull consumer named {name!r}")
        if not isinstance(found, Consumer):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})
        return found

    errors: dict[int | str, dict[str, Any]] = {
        401: {"description": "missing or wrong bearer token (whether or not the consumer exists)"},
        404: {"description": "no such consumer (told only to a caller with a valid token)"},
        413: {"description": f"request body over {MAX_BODY_BYTES} bytes"}}

    @app.post("/api/consumers/{name}/receive", response_model=ReceiveResponse, responses=errors)
    async def receive(body: ReceiveRequest, request: Request,
                      who: Annotated[Consumer, Depends(consumer)]) -> Response:
        out = await service.receive(who, body.batch_size, body.wait_for_ms, request.is_disconnected)
        if out is None:
            return Response(status_code=499)  # nobody to answer
        return Response(out, media_type="application/json")

    @app.post("/api/consumers/{name}/ack", response_model=SettleResponse, responses=errors)
    async def ack(body: SettleRequest, who: Annotated[Consumer, Depends(consumer)]) -> Response:
        return Response(await service.settle(who, body.ack_ids), media_type="application/json")

    @app.post("/api/consumers/{name}/nack", response_model=SettleResponse, responses=errors)
    async def nack(body: SettleRequest, who: Annotated[Consumer, Depends(consumer)]) -> Response:
        return Response(await service.settle(who, body.ack_ids, nack=True), media_type="application/json")

    return app, service
