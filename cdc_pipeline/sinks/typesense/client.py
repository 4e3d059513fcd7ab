"""Typesense sink over its HTTP API (httpx, asyncio, on the sink's event loop thread).

* Upserts go in `documents/import?action=upsert` requests of the sink's `batch_size` documents, one JSON line
  each; the answer has a line per document, and each is that message's outcome (a document Typesense
  refuses, e.g. a value of the wrong type, is parked with its error; the document itself is never echoed).
  Deletes are `DELETE documents/<id>` (a document already gone counts as deleted).
* A request holds at most one change per group (by default a row), and a group's next change goes out
  only once the previous one was acknowledged (the scheduler's, delivery/schedule/), so a row never ends
  older than its last change.
* A TRUNCATE empties the collection (dropped and created again with its schema as it was), in a request of
  its own (`alone`), after every earlier message the scheduler was handed with it and before every later one.
* A collection that does not exist is created on first use, its schema from the table's columns
  (documents.py). Routes name collections (`route_prefixes` restricts them).
* Nothing answering, a timeout, 401/403, 429 and 5xx are an outage (waited for, nothing counted). The API
  key travels in a header only: never in errors or logs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx

from cdc_pipeline.sinks.base import Limits, OutboundMessage, SinkConfigLike, Unreachable, safe_endpoint
from cdc_pipeline.sinks.batch_plan import RequestLimits
from cdc_pipeline.sinks.batching import BatchingSink, DestinationDown, Encoded
from cdc_pipeline.sinks.typesense.documents import (
    Change,
    change_of,
    collection_schema,
    recreate_schema,
    route_problem,
)

# The sink's declared limits (sinks/base.py Limits); `sinks[].batch_size` / `max_in_flight` override them.
BATCH_SIZE = 100  # documents per import request by default
MAX_IN_FLIGHT = 4  # requests out at once by default

MAX_REQUEST_BYTES = 64 * 1024 * 1024
MAX_DOCUMENTS = 10_000  # per import request, at most (a call is the sink's `batch_size`)
MAX_CONNECTIONS = 400  # kept open, at most: as many as requests are out at once (the scheduler's)
_DOWN_STATUSES = frozenset({401, 403, 408, 429})


class TypesenseSink(BatchingSink):
    kind = "typesense"
    holds_rows = True  # the latest version of each row: a replay continues up to the sink's offset
    request_limits = RequestLimits(max_entries=MAX_DOCUMENTS, max_request_bytes=MAX_REQUEST_BYTES,
                                   max_entry_bytes=MAX_REQUEST_BYTES, what="Typesense document")

    @classmethod
    def takes_truncates(cls, sink_config: SinkConfigLike) -> bool:
        return True

    def __init__(self, sink_config: SinkConfigLike) -> None:
        dest = sink_config.destination
        super().__init__(sink_config.name)
        self.url: str = dest.endpoint_url.rstrip("/")
        self.where = safe_endpoint(self.url)
        self.collection_name: str | None = dest.collection_name
        self.route_prefixes: list[str] | None = dest.route_prefixes
        self.timeout_s: float = dest.timeout_seconds
        self._key = dest.api_key
        self._http: httpx.AsyncClient | None = None
        self._tables: dict[str, Any] = {}  # schema.table -> TableInfo or None
        self._collections: set[str] = set()  # known to exist
        self._creating = asyncio.Lock()

    # -- connection ---------------------------------------------------------------------------------
    async def connect(self) -> None:
        await self.disconnect()
        self._http = httpx.AsyncClient(base_url=self.url, timeout=self.timeout_s,
                                       headers={"X-TYPESENSE-API-KEY": self._key.get_secret_value()},
                                       limits=httpx.Limits(max_connections=MAX_CONNECTIONS))
        self._collections.clear()
        self._tables.clear()  # described afresh each session: the source may have changed meanwhile
        self._creating = asyncio.Lock()
        # /health answers without a key: a collection lookup says whether the key is taken
        probe = quote(self.collection_name or "cdc_pipeline_probe", safe="")
        await self._request("GET", f"/collections/{probe}", ok=(200, 404))

    async def disconnect(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    async def _request(self, method: str, path: str, ok: tuple[int, ...] = (200, 201), **kw: Any) -> httpx.Response:
        """A request whose status is in `ok` (else an error naming it); an outage raises DestinationDown."""
        assert self._http is not None
        try:
            response = await self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise DestinationDown(f"{self.where} did not answer: {type(exc).__name__}") from None
        if response.status_code in _DOWN_STATUSES or response.status_code >= 500:
            raise DestinationDown(f"{self.where} answered {response.status_code} {_message(response)}")
        if response.status_code not in ok:
            raise _Refused(f"typesense: {method} {path.split('?')[0]}: {response.status_code} {_message(response)}")
        return response

    # -- messages -----------------------------------------------------------------------------------
    def encode(self, message: OutboundMessage) -> Encoded | str:
        problem = route_problem(message.route, self.route_prefixes)
        if problem:
            return problem
        change = change_of(message.payload, self._keys)
        if isinstance(change, str):
            return change
        collection = message.route or self.collection_name or change.table
        if collection is None:
            return "typesense: no collection: the message names no table and the sink has no collection_name"
        size = len(change.line or change.doc_id or "")
        return Encoded(collection, change, size)

    def limits(self) -> Limits:
        return Limits(batch_size=BATCH_SIZE, max_in_flight=MAX_IN_FLIGHT, ordered=False)

    def alone(self, message: OutboundMessage) -> bool:
        if b'"truncate"' not in message.payload:  # the usual message: no parse
            return False
        change = change_of(message.payload, lambda table: None)  # a truncate needs no key
        return not isinstance(change, str) and change.op == "truncate"

    def _keys(self, table: str) -> Sequence[str] | None:
        info = self._table(table)
        return (info.primary_key or info.identity_columns) if info is not None else None

    def _table(self, table: str) -> Any:
        if table not in self._tables:
            self._tables[table] = self.context.describe(table)
        return self._tables[table]

    async def send_request(self, target: str, entries: Sequence[tuple[OutboundMessage, Any]]) -> list[str | None]:
        changes: list[Change] = [c for _, c in entries]
        try:
            if changes[0].op == "truncate":
                await self._truncate(target)
                return [None]
            await self._ensure(target, changes)
            upserts = [n for n, c in enumerate(changes) if c.op == "upsert"]
            deletes = [n for n, c in enumerate(changes) if c.op == "delete"]
            results: list[str | None] = [None] * len(changes)
            outcomes = await asyncio.gather(self._import(target, [changes[n] for n in upserts]),
                                            *(self._delete(target, changes[n]) for n in deletes))
            for n, r in zip(upserts, outcomes[0], strict=True):
                results[n] = r
            for n, r in zip(deletes, outcomes[1:], strict=True):
                results[n] = r
            return results
        except _Refused as exc:
            self._collections.discard(target)  # gone, perhaps: look again next time
            return [str(exc)] * len(changes)

    async def _ensure(self, collection: str, changes: list[Change]) -> None:
        if collection in self._collections:
            return
        async with self._creating:
            path = f"/collections/{quote(collection, safe='')}"
            found = await self._request("GET", path, ok=(200, 404))
            if found.status_code == 404:
                table = next((c.table for c in changes if c.table), None)
                info = self._table(table) if table else None
                columns = [(c.name, c.type_sql) for c in info.columns] if info is not None else None
                await self._request("POST", "/collections", ok=(200, 201, 409),
                                    json=collection_schema(collection, columns))
            self._collections.add(collection)

    async def _import(self, collection: str, upserts: list[Change]) -> list[str | None]:
        if not upserts:
            return []
        body = "\n".join(c.line or "" for c in upserts).encode()
        response = await self._request("POST", f"/collections/{quote(collection, safe='')}/documents/import",
                                       params={"action": "upsert"}, content=body)
        lines = response.text.splitlines()
        if len(lines) != len(upserts):
            return [Unreachable(f"typesense answered {len(lines)} results for {len(upserts)} documents")] * len(upserts)
        return [_line_result(line) for line in lines]

    async def _delete(self, collection: str, change: Change) -> str | None:
        await self._request("DELETE", f"/collections/{quote(collection, safe='')}/documents/"
                            f"{quote(change.doc_id or '', safe='')}", ok=(200, 404))
        return None

    async def _truncate(self, collection: str) -> None:
        path = f"/collections/{quote(collection, safe='')}"
        found = await self._request("GET", path, ok=(200, 404))
        if found.status_code == 404:
            return  # nothing to empty
        await self._request("DELETE", path, ok=(200, 404))
        await self._request("POST", "/collections", ok=(200, 201, 409), json=recreate_schema(found.json()))
        self._collections.add(collection)


class _Refused(Exception):
    """Typesense refused a request for a reason of the request's own (its messages fail)."""


def _line_result(line: str) -> str | None:
    try:
        result = json.loads(line)
    except ValueError:
        return Unreachable("typesense: an import result that is not JSON")
    if result.get("success"):
        return None
    text = f"typesense: {result.get('code', '')} {str(result.get('error', ''))[:300]}".rstrip()
    code = int(result.get("code") or 400)
    return Unreachable(text) if code >= 500 or code in _DOWN_STATUSES else text


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", ""))[:300]
    except ValueError:
        return ""
