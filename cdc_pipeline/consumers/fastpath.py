"""The hot path of the pull API as plain ASGI, in front of the FastAPI app.

Every request is authenticated here before its body is read (a caller without a valid token gets
FastAPI's 401 from an empty body, whatever it sends, and the connection is closed), and no body is read
past MAX_BODY_BYTES (413). A receive/ack/nack that is well-formed and authorized is answered here: the
same validation models and the same service calls as the FastAPI routes, without the per-request
routing, dependency solving and middleware stack (measured: about a third of serve's CPU per request).
Anything else, an unknown consumer, a body that does not validate, another content type,
/openapi.json, and the lifespan events, goes to the FastAPI app unchanged (the body already read is
replayed to it), so every error answer and the OpenAPI document stay FastAPI's own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from cdc_pipeline.consumers.app import (
    MAX_BODY_BYTES,
    Consumer,
    PullService,
    ReceiveRequest,
    SettleRequest,
    authenticate,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Starlette's `{name}` matches one path segment of the decoded path, as here.
ROUTE = re.compile(r"/api/consumers/([^/]+)/(receive|ack|nack)")


class FastPath:
    def __init__(self, app: ASGIApp, service: PullService) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)  # lifespan
            return
        headers = _headers(scope)
        length = _length(headers)
        match = None if scope.get("root_path") else ROUTE.fullmatch(scope["path"])
        if match is None:  # not a consumer route (/openapi.json, 404s): FastAPI's, its body bounded too
            if length is not None and length > MAX_BODY_BYTES:
                await too_large(send)
                return
            await self.app(scope, bounded(receive), send)
            return
        auth = headers.get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        who = authenticate(self.service.consumers, match[1],
                           token.decode("latin-1") if scheme.lower() == b"bearer" else None)
        if not isinstance(who, Consumer):
            # FastAPI's own 401/404 (or 405), from an empty body: the request's body is never read.
            await self.app(scope, replay(b"", _nothing), closing(send))
            return
        if length is not None and length > MAX_BODY_BYTES:
            await too_large(send)
            return
        body = await read_body(receive)
        if body is None:
            return  # gone before its request was complete: nothing to do or answer
        if body is TOO_LARGE:
            await too_large(send)
            return
        if scope["method"] != "POST" or headers.get(b"content-type") != b"application/json" or scheme != b"Bearer":
            await self.app(scope, replay(body, receive), send)  # FastAPI answers it the same way
            return
        verb = match[2]
        try:
            parsed = json.loads(body)  # as FastAPI parses a JSON body, then validates the object
            request: ReceiveRequest | SettleRequest = (
                ReceiveRequest if verb == "receive" else SettleRequest).model_validate(parsed)
        except (ValueError, ValidationError):  # FastAPI answers it (422 with the details)
            await self.app(scope, replay(body, receive), send)
            return
        if isinstance(request, ReceiveRequest):
            out = await self.service.receive(who, request.batch_size, request.wait_for_ms,
                                             Request(scope, receive).is_disconnected)
            if out is None:
                await respond(send, 499, b"")  # nobody to answer
                return
        else:
            out = await self.service.settle(who, request.ack_ids, nack=verb == "nack")
        await respond(send, 200, out)


TOO_LARGE = b"\0too large"  # a sentinel: read_body stopped past MAX_BODY_BYTES


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """The first value of each header (as Starlette reads them)."""
    out: dict[bytes, bytes] = {}
    for key, value in scope["headers"]:
        out.setdefault(key, value)
    return out


def _length(headers: dict[bytes, bytes]) -> int | None:
    try:
        return int(headers[b"content-length"])
    except (KeyError, ValueError):
        return None


async def read_body(receive: Receive) -> bytes | None:
    """The whole body, TOO_LARGE once past MAX_BODY_BYTES (the rest is never read), None on disconnect."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return TOO_LARGE
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def bounded(receive: Receive) -> Receive:
    """`receive` for the wrapped app off the consumer routes: past MAX_BODY_BYTES the client is gone."""
    size = 0

    async def limited() -> Message:
        nonlocal size
        message = await receive()
        size += len(message.get("body", b""))
        return {"type": "http.disconnect"} if size > MAX_BODY_BYTES else message

    return limited


async def _nothing() -> Message:
    return {"type": "http.disconnect"}


def closing(send: Send) -> Send:
    """Answer, then close the connection: the unread body must not be read (and thrown away) after it."""

    async def close_after(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return close_after


async def too_large(send: Send) -> None:
    body = json.dumps({"detail": f"request body over {MAX_BODY_BYTES} bytes"}).encode()
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-length", str(len(body)).encode()), (b"content-type", b"application/json"),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def replay(body: bytes, receive: Receive) -> Receive:
    """`receive` for the wrapped app: the body already read, then the connection's own messages."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def respond(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if body:
        headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
