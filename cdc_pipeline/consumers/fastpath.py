"""The hot path of the pull API as plain ASGI, in front of the FastAPI app.

A receive/ack/nack that is well-formed and authorized is answered here: the same validation models and
the same service calls as the FastAPI routes, without the per-request routing, dependency solving and
middleware stack (measured: about a third of serve's CPU per request). Anything else, a missing or wrong
token, an unknown consumer, a body that does not validate, another content type, /openapi.json, and the
lifespan events, goes to the FastAPI app unchanged (the body already read is replayed to it), so every
error answer and the OpenAPI document stay FastAPI's own.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from cdc_pipeline.consumers.app import Consumer, PullService, ReceiveRequest, SettleRequest

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
        self.auth = {name: b"Bearer " + c.token.encode() for name, c in service.consumers.items()}

    def _consumer(self, scope: Scope) -> tuple[Consumer, str] | None:
        """The consumer and verb of an authorized JSON POST to one of the three routes, else None."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        match = ROUTE.fullmatch(scope["path"])
        if match is None or match[1] not in self.auth:
            return None
        auth = content_type = None
        for key, value in scope["headers"]:
            if key == b"authorization" and auth is None:
                auth = value
            elif key == b"content-type" and content_type is None:
                content_type = value
        if content_type != b"application/json" or auth is None:
            return None
        if not hmac.compare_digest(auth, self.auth[match[1]]):
            return None
        return self.service.consumers[match[1]], match[2]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._consumer(scope)
        if found is None:
            await self.app(scope, receive, send)
            return
        who, verb = found
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # gone before its request was complete: nothing to do or answer
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
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
