"""Fake SaaS APIs served as REAL local HTTP servers (http.server in a thread) for the API sync tests.

One ``FakeApi`` holds collections of records with a modification time each and answers in one of three
styles: Salesforce (OAuth2 client credentials, SOQL through queryAll with IsDeleted, Sforce-Limit-Info),
HubSpot (CRM v3 search with filter groups, archived objects, X-HubSpot-RateLimit-* headers) and a
generic REST API (updated_since + opaque cursor). It logs every data request with its arrival time, can
answer with bursts of 429s, and can expire the OAuth tokens it issued.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

T0 = datetime(2024, 1, 1, tzinfo=UTC)


@dataclass
class Rec:
    id: str
    fields: dict[str, Any]
    modified: datetime
    deleted: bool = False


@dataclass
class Logged:
    at: float  # time.monotonic() at arrival
    collection: str
    status: int
    query: str = ""
    ids: list[str] = field(default_factory=list)


def _sf_time(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}+0000"


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class FakeApi:
    def __init__(self, style: str, quota: tuple[int, float] | None = None) -> None:
        self.style = style
        self.collections: dict[str, dict[str, Rec]] = {}
        self.lock = threading.Lock()
        self.log: list[Logged] = []
        self.tokens: set[str] = set()
        self.token_requests = 0
        self.unauthorized = 0
        self.fail_429 = 0  # answer the next N data requests with 429
        self.retry_after: str | None = "1"
        self.quota = quota  # for quota headers: (requests, seconds)
        self.sforce_used = 0
        self.sforce_limit = 100000
        self.hubspot_remaining_override: int | None = None
        self.reject_tokens = False  # OAuth tokens are issued, yet every data request answers 401
        self.offset_cursors = False  # rest: next_cursor is an offset into the listing (shifts on deletes)
        self.fail_with: tuple[int, str] | None = None  # answer the next data request with (status, raw body)
        self.on_request: Callable[[str], None] | None = None  # called after a data response was sent
        self._clock = T0
        self.client_id, self.client_secret = "cid", "csecret-" + uuid.uuid4().hex
        self.bearer = "bearer-" + uuid.uuid4().hex
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # --- lifecycle -------------------------------------------------------------------------------------
    def __enter__(self) -> FakeApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    # --- data ------------------------------------------------------------------------------------------
    def tick(self, ms: int = 1) -> datetime:
        self._clock += timedelta(milliseconds=ms)
        return self._clock

    def put(self, coll: str, rid: str, at: datetime | None = None, **fields: Any) -> Rec:
        """Create or update a record (its modification time: ``at``, else the fake's clock ticks)."""
        with self.lock:
            at = at or self.tick()
            self._clock = max(self._clock, at)  # modification times only move forward
            recs = self.collections.setdefault(coll, {})
            old = recs.get(rid)
            rec = Rec(rid, {**(old.fields if old and not old.deleted else {}), **fields}, at)
            recs[rid] = rec
            return rec

    def delete(self, coll: str, rid: str) -> None:
        with self.lock:
            rec = self.collections[coll][rid]
            if self.style == "rest":
                del self.collections[coll][rid]
            else:  # Salesforce: IsDeleted (recycle bin); HubSpot: archived
                rec.deleted, rec.modified = True, self.tick()

    def live(self, coll: str) -> dict[str, Rec]:
        with self.lock:
            return {k: r for k, r in self.collections.get(coll, {}).items() if not r.deleted}

    def expire_tokens(self) -> None:
        with self.lock:
            self.tokens.clear()

    def data_log(self, status: int | None = None) -> list[Logged]:
        with self.lock:
            return [e for e in self.log if status is None or e.status == status]

    def max_in_window(self, seconds: float) -> int:
        """The most data requests that arrived within any window of ``seconds``."""
        times = sorted(e.at for e in self.data_log())
        best, j = 0, 0
        for i, t in enumerate(times):
            while times[j] <= t - seconds:
                j += 1
            best = max(best, i - j + 1)
        return best

    def _sorted(self, coll: str) -> list[Rec]:
        key = (lambda r: (r.modified, int(r.id))) if self.style == "hubspot" else (lambda r: (r.modified, r.id))
        return sorted(self.collections.get(coll, {}).values(), key=key)

    # --- HTTP ------------------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _send_raw(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _serve(self, method: str) -> None:
                arrived = time.monotonic()
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if parts.path == "/services/oauth2/token":
                    form = parse_qs(raw.decode())
                    with api.lock:
                        api.token_requests += 1
                        if form.get("client_id") != [api.client_id] or form.get("client_secret") != [api.client_secret]:
                            return self._send(400, {"error": "invalid_client"})
                        token = "tok-" + uuid.uuid4().hex
                        api.tokens.add(token)
                    return self._send(200, {"access_token": token, "instance_url": api.url, "token_type": "Bearer"})
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                body = json.loads(raw) if raw else None
                auth = self.headers.get("Authorization", "")
                with api.lock:
                    ok = (auth.removeprefix("Bearer ") in api.tokens and not api.reject_tokens) \
                        if api.style == "salesforce" else (auth == f"Bearer {api.bearer}")
                    if not ok:
                        api.unauthorized += 1
                        return self._send(401, [{"errorCode": "INVALID_SESSION_ID"}])
                    coll = self._collection(parts.path, query)
                    if api.fail_with is not None:
                        status, text = api.fail_with
                        api.fail_with = None
                        api.log.append(Logged(arrived, coll, status))
                        return self._send_raw(status, text.encode())
                    if api.fail_429 > 0:
                        api.fail_429 -= 1
                        api.log.append(Logged(arrived, coll, 429))
                        headers = {"Retry-After": api.retry_after} if api.retry_after else {}
                        return self._send(429, {"message": "rate limited"}, headers)
                    status, out, ids = api._answer(method, parts.path, query, body)
                    api.log.append(Logged(arrived, coll, status, query.get("q", "") or json.dumps(body or query),
                                          ids))
                    headers = api._quota_headers(arrived)
                self._send(status, out, headers)
                if api.on_request is not None:
                    api.on_request(coll)

            def _collection(self, path: str, query: dict[str, str]) -> str:
                if "q" in query:
                    m = re.search(r"FROM (\w+)", query["q"])
                    return m[1] if m else "?"
                m = re.match(r"/crm/v3/objects/(\w+)", path)
                return m[1] if m else path.strip("/")

        return Handler

    def _quota_headers(self, now: float) -> dict[str, str]:
        if self.quota is None:
            return {}
        if self.style == "salesforce":
            self.sforce_used += 1
            return {"Sforce-Limit-Info": f"api-usage={self.sforce_used}/{self.sforce_limit}"}
        if self.style == "hubspot":
            n, seconds = self.quota
            used = sum(1 for e in self.log if e.at > now - seconds)
            remaining = n - used if self.hubspot_remaining_override is None else self.hubspot_remaining_override
            return {"X-HubSpot-RateLimit-Max": str(n), "X-HubSpot-RateLimit-Remaining": str(max(0, remaining)),
                    "X-HubSpot-RateLimit-Interval-Milliseconds": str(int(seconds * 1000))}
        return {}

    # --- answers per style -----------------------------------------------------------------------------
    def _answer(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any, list[str]]:
        if self.style == "salesforce" and path.endswith("/queryAll"):
            return self._soql(query["q"])
        if self.style == "hubspot" and path.endswith("/search"):
            return self._hs_search(path.split("/")[4], body)
        if self.style == "hubspot" and query.get("archived") == "true":
            return self._hs_archived(path.split("/")[4], query)
        if self.style == "rest":
            return self._rest(path.strip("/"), query)
        return 404, {"message": "not found"}, []

    _SOQL = re.compile(
        r"SELECT (?P<fields>.+?) FROM (?P<obj>\w+)"
        r"(?: WHERE (?P<c>\w+) > (?P<v>\S+) OR \((?P=c) = (?P=v) AND (?P<i>\w+) > '(?P<id>[^']*)'\))?"
        r"(?: ORDER BY (?P<oc>\w+), (?P<oi>\w+))?(?: LIMIT (?P<limit>\d+))?$")

    def _soql(self, q: str) -> tuple[int, Any, list[str]]:
        m = self._SOQL.match(q)
        if m is None:
            return 400, [{"errorCode": "MALFORMED_QUERY", "message": q}], []
        recs = self._sorted(m["obj"])
        if m["fields"] == "COUNT()":
            return 200, {"totalSize": sum(1 for r in recs if not r.deleted), "done": True, "records": []}, []
        if m["v"]:
            after = (datetime.strptime(m["v"], "%Y-%m-%dT%H:%M:%S.%f%z"), m["id"])
            recs = [r for r in recs if (r.modified, r.id) > after]
        recs = recs[: int(m["limit"] or 2000)]
        fields = [f.strip() for f in m["fields"].split(",")]
        out = []
        for r in recs:
            row: dict[str, Any] = {"attributes": {"type": m["obj"]}}
            for f in fields:
                row[f] = (r.id if f == "Id" else _sf_time(r.modified) if f == "SystemModstamp"
                          else r.deleted if f == "IsDeleted" else r.fields.get(f))
            out.append(row)
        return 200, {"totalSize": len(out), "done": True, "records": out}, [r.id for r in recs]

    def _hs_record(self, r: Rec) -> dict[str, Any]:
        props = {k: (None if v is None else str(v)) for k, v in r.fields.items()}
        props.update(hs_object_id=r.id, hs_lastmodifieddate=_iso(r.modified))
        return {"id": r.id, "properties": props, "createdAt": _iso(T0), "updatedAt": _iso(r.modified),
                "archived": r.deleted}

    def _hs_search(self, coll: str, body: dict[str, Any]) -> tuple[int, Any, list[str]]:
        recs = [r for r in self._sorted(coll) if not r.deleted]
        total = len(recs)
        groups = body.get("filterGroups") or []
        if groups:
            def match(r: Rec) -> bool:
                for g in groups:
                    ok = True
                    for f in g["filters"]:
                        left: Any = r.modified if f["propertyName"] == "hs_lastmodifieddate" else int(r.id)
                        right: Any = (_parse_time(f["value"]) if f["propertyName"] == "hs_lastmodifieddate"
                                      else int(f["value"]))
                        ok &= {"GT": left > right, "EQ": left == right, "GTE": left >= right}[f["operator"]]
                    if ok:
                        return True
                return False

            recs = [r for r in recs if match(r)]
            total = len(recs)
        recs = recs[: int(body.get("limit", 10))]
        return 200, {"total": total, "results": [self._hs_record(r) for r in recs]}, [r.id for r in recs]

    def _hs_archived(self, coll: str, query: dict[str, str]) -> tuple[int, Any, list[str]]:
        recs = sorted((r for r in self.collections.get(coll, {}).values() if r.deleted), key=lambda r: int(r.id))
        start = int(query.get("after") or 0)
        limit = int(query.get("limit", 10))
        page = recs[start:start + limit]
        out: dict[str, Any] = {"results": [{**self._hs_record(r), "archivedAt": _iso(r.modified)} for r in page]}
        if start + limit < len(recs):
            out["paging"] = {"next": {"after": str(start + limit)}}
        return 200, out, [r.id for r in page]

    def _rest(self, coll: str, query: dict[str, str]) -> tuple[int, Any, list[str]]:
        recs = self._sorted(coll)
        if "updated_since" in query:
            since = _parse_time(query["updated_since"])
            recs = [r for r in recs if r.modified >= since]
        limit = int(query.get("limit", 50))
        if self.offset_cursors:  # page N+1 starts at offset N x limit of the listing as it is NOW
            start = int(query.get("cursor") or 0)
            page = recs[start:start + limit]
            more = start + limit < len(recs)
            out: dict[str, Any] = {"data": [{"id": r.id, "updated_at": _iso(r.modified), **r.fields} for r in page],
                                   "next_cursor": str(start + limit) if more else None}
            return 200, out, [r.id for r in page]
        if query.get("cursor"):
            t, rid = json.loads(base64.urlsafe_b64decode(query["cursor"]))
            after = (_parse_time(t), rid)
            recs = [r for r in recs if (r.modified, r.id) > after]
        page = recs[:limit]
        out = {"data": [{"id": r.id, "updated_at": _iso(r.modified), **r.fields} for r in page]}
        if len(recs) > limit:
            last = page[-1]
            out["next_cursor"] = base64.urlsafe_b64encode(json.dumps([_iso(last.modified), last.id]).encode()).decode()
        else:
            out["next_cursor"] = None
        return 200, out, [r.id for r in page]
