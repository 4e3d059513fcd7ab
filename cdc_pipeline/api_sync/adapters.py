"""One adapter per API type: how to page through a collection by modification time, and where deletes
show. Each ``fetch`` is ONE request; its cursor state is plain JSON the loop checkpoints.

Cursor ties (records with the same modification time across a page boundary) are the classic way to
skip or repeat records. Salesforce- and HubSpot-style APIs can filter on (time, id) pairs, so they page
by keyset ``(cursor, id) > (last cursor, last id)``. The generic REST API only takes ``updated_since``
(inclusive) plus an opaque page token, so a completed pass remembers the ids seen at its highest time
and the next pass (which asks from that time again) drops exactly those.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cdc_pipeline.api_sync.client import ApiClient
from cdc_pipeline.config.api_sources import ApiCollectionConfig, ApiSourceConfig


@dataclass
class Page:
    records: list[dict[str, Any]]  # live records to upsert
    deleted: list[str]  # ids to delete
    state: dict[str, Any]  # the new cursor state
    caught_up: bool  # the pass is complete: nothing newer right now


@dataclass
class SweepPage:
    deleted: list[str]  # ids the API says are gone
    seen: list[str] = field(default_factory=list)  # ids that exist (full id sweep)
    state: dict[str, Any] = field(default_factory=dict)
    done: bool = True
    delete_unseen: bool = False  # at the end: delete every row the sweep did not see


def time_key(value: Any) -> tuple[int, Any]:
    """Order cursor values: ISO times as times (any offset notation), else numbers, else text."""
    if isinstance(value, int | float):
        return (0, float(value))
    text = str(value)
    try:
        return (1, datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        return (2, text)


class Adapter:
    supports_total = False
    sweeps = False  # deletes are found by a periodic listing (``sweep``), one page per round (loop.py)

    def __init__(self, source: ApiSourceConfig, client: ApiClient) -> None:
        self.source = source
        self.client = client

    def record_id(self, coll: ApiCollectionConfig, rec: dict[str, Any]) -> str:
        return str(rec[coll.id_field])

    def value(self, coll: ApiCollectionConfig, rec: dict[str, Any], name: str) -> Any:
        return rec.get(name)

    def fetch(self, coll: ApiCollectionConfig, state: dict[str, Any]) -> Page:
        raise NotImplementedError

    def total(self, coll: ApiCollectionConfig) -> int | None:
        return None

    def sweep(self, coll: ApiCollectionConfig, state: dict[str, Any]) -> SweepPage | None:
        """One page of the periodic delete check; None when the API shows deletes in ``fetch``."""
        return None


def _soql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class SalesforceAdapter(Adapter):
    """SOQL through ``queryAll`` (which includes deleted records, ``IsDeleted = true``), keyset on
    (cursor field, Id)."""

    supports_total = True

    def _query(self, coll: ApiCollectionConfig, soql: str) -> Any:
        return self.client.request(coll.name, "GET", f"/services/data/{self.source.api_version}/queryAll",
                                   params={"q": soql})

    def total(self, coll: ApiCollectionConfig) -> int | None:
        return int(self._query(coll, f"SELECT COUNT() FROM {coll.name}")["totalSize"])

    def fetch(self, coll: ApiCollectionConfig, state: dict[str, Any]) -> Page:
        c, i = coll.cursor_field, coll.id_field
        fields = list(dict.fromkeys([i, c, "IsDeleted", *coll.fields]))
        where = ""
        after = state.get("after")
        if after:
            # Datetime literals are unquoted in SOQL; the value is the API's own, re-sent as is.
            v, last_id = after
            if any(ch in str(v) for ch in " '()\\"):
                raise ValueError(f"unexpected cursor value {v!r}")
            where = f" WHERE {c} > {v} OR ({c} = {v} AND {i} > {_soql_string(last_id)})"
        soql = f"SELECT {', '.join(fields)} FROM {coll.name}{where} ORDER BY {c}, {i} LIMIT {coll.page_size}"
        records = self._query(coll, soql)["records"]
        if records:
            after = [records[-1][c], str(records[-1][i])]
        return Page(
            records=[r for r in records if not r.get("IsDeleted")],
            deleted=[str(r[i]) for r in records if r.get("IsDeleted")],
            state={"after": after},
            caught_up=len(records) < coll.page_size,
        )


class HubSpotAdapter(Adapter):
    """CRM v3 search sorted by (modification time, id) with keyset filter groups; archived objects
    (deletes) from the object listing with ``archived=true``, checked periodically."""

    supports_total = True

    def value(self, coll: ApiCollectionConfig, rec: dict[str, Any], name: str) -> Any:
        props = rec.get("properties") or {}
        return props[name] if name in props else rec.get(name)

    def record_id(self, coll: ApiCollectionConfig, rec: dict[str, Any]) -> str:
        return str(self.value(coll, rec, coll.id_field))

    def _search(self, coll: ApiCollectionConfig, groups: list[Any], limit: int) -> Any:
        body = {
            "filterGroups": groups,
            "sorts": [{"propertyName": coll.cursor_field, "direction": "ASCENDING"},
                      {"propertyName": "hs_object_id", "direction": "ASCENDING"}],
            "properties": list(dict.fromkeys([coll.cursor_field, *coll.fields])),
            "limit": limit,
        }
        return self.client.request(coll.name, "POST", f"/crm/v3/objects/{coll.name}/search", json=body)

    def total(self, coll: ApiCollectionConfig) -> int | None:
        return int(self._search(coll, [], 1).get("total", 0))

    def fetch(self, coll: ApiCollectionConfig, state: dict[str, Any]) -> Page:
        c = coll.cursor_field
        after = state.get("after")
        groups: list[Any] = []
        if after:
            v, last_id = after
            groups = [{"filters": [{"propertyName": c, "operator": "GT", "value": v}]},
                      {"filters": [{"propertyName": c, "operator": "EQ", "value": v},
                                   {"propertyName": "hs_object_id", "operator": "GT", "value": last_id}]}]
        results = self._search(coll, groups, coll.page_size)["results"]
        if results:
            after = [self.value(coll, results[-1], c), self.record_id(coll, results[-1])]
        return Page(records=results, deleted=[], state={"after": after}, caught_up=len(results) < coll.page_size)

    def sweep(self, coll: ApiCollectionConfig, state: dict[str, Any]) -> SweepPage | None:
        params: dict[str, Any] = {"archived": "true", "limit": coll.page_size}
        if state.get("after"):
            params["after"] = state["after"]
        body = self.client.request(coll.name, "GET", f"/crm/v3/objects/{coll.name}", params=params)
        nxt = ((body.get("paging") or {}).get("next") or {}).get("after")
        return SweepPage(deleted=[self.record_id(coll, r) for r in body["results"]],
                         state={"after": nxt}, done=not nxt)


class RestAdapter(Adapter):
    """Generic cursor-paginated JSON: ``GET {path}?updated_since=T&limit=N[&cursor=TOKEN]`` answering
    ``{"data": [...], "next_cursor": TOKEN | null}``; deletes found by a periodic full id sweep."""

    sweeps = True

    def _path(self, coll: ApiCollectionConfig) -> str:
        return coll.path or f"/{coll.name}"

    def fetch(self, coll: ApiCollectionConfig, state: dict[str, Any]) -> Page:
        since, ties = state.get("since"), set(state.get("ties") or [])
        params: dict[str, Any] = {"limit": coll.page_size}
        if since is not None:
            params["updated_since"] = since
        if state.get("token"):
            params["cursor"] = state["token"]
        body = self.client.request(coll.name, "GET", self._path(coll), params=params)
        pass_max, pass_ties = state.get("pass_max"), list(state.get("pass_ties") or [])
        fresh = []
        for rec in body["data"]:
            rid, when = self.record_id(coll, rec), rec.get(coll.cursor_field)
            if since is not None and when == since and rid in ties:
                continue  # seen by the previous pass at the same time: a tie, not a change
            fresh.append(rec)
            if pass_max is None or time_key(when) > time_key(pass_max):
                pass_max, pass_ties = when, [rid]
            elif when == pass_max and rid not in pass_ties:
                pass_ties.append(rid)
        token = body.get("next_cursor")
        if token:
            new = {**state, "token": token, "pass_max": pass_max, "pass_ties": pass_ties}
        elif pass_max is None:  # an empty pass: nothing changed, the old position stands
            new = {"since": since, "ties": sorted(ties)}
        elif since is not None and pass_max == since:
            new = {"since": since, "ties": sorted(ties | set(pass_ties))}
        else:
            new = {"since": pass_max, "ties": sorted(pass_ties)}
        return Page(records=fresh, deleted=[], state=new, caught_up=not token)

    def sweep(self, coll: ApiCollectionConfig, state: dict[str, Any]) -> SweepPage | None:
        params: dict[str, Any] = {"limit": coll.page_size}
        if state.get("token"):
            params["cursor"] = state["token"]
        body = self.client.request(coll.name, "GET", self._path(coll), params=params)
        token = body.get("next_cursor")
        return SweepPage(deleted=[], seen=[self.record_id(coll, r) for r in body["data"]],
                         state={"token": token}, done=not token, delete_unseen=True)


ADAPTERS: dict[str, type[Adapter]] = {"salesforce": SalesforceAdapter, "hubspot": HubSpotAdapter,
                                      "rest": RestAdapter}


def build_adapter(source: ApiSourceConfig, client: ApiClient) -> Adapter:
    return ADAPTERS[source.type](source, client)
