"""API sync's pure parts: the budget scheduler, quota headers, Retry-After, adapters' tie handling
helpers, value typing, and the api_sources config errors."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_pipeline.api_sync.adapters import time_key
from cdc_pipeline.api_sync.budget import (
    BudgetState,
    Quota,
    hint_from_headers,
    pause,
    reserve,
    retry_after_seconds,
)
from cdc_pipeline.api_sync.writer import typed
from cdc_pipeline.config import ConfigError, parse_config


@settings(max_examples=200, deadline=None)
@given(requests=st.integers(1, 200), seconds=st.floats(0.5, 120), share=st.floats(0.05, 1.0),
       arrivals=st.lists(st.floats(0, 5), min_size=1, max_size=150),
       lateness=st.lists(st.floats(0, 1), min_size=150, max_size=150))
def test_no_window_ever_sees_more_than_the_budget(requests, seconds, share, arrivals, lateness):
    """Callers arriving at any times (several processes) and sending up to guard/2 late never put more
    than share x quota requests into any window of the quota's length."""
    quota = Quota(requests, seconds, share)
    state, now, sent = BudgetState(), 1000.0, []
    for gap, late in zip(arrivals, lateness, strict=False):
        now += gap
        state, start = reserve(state, now, quota)
        sent.append(start + late * quota.guard / 2)
    sent.sort()
    j = 0
    for i, t in enumerate(sent):
        while sent[j] <= t - seconds:
            j += 1
        assert i - j + 1 <= quota.budget


def test_pacing_pause_and_factor():
    quota = Quota(40, 60, 0.5)  # 20 per minute: one request every 3.05 s (with the guard)
    assert quota.budget == 20 and quota.interval() == pytest.approx(3.05)
    state, first = reserve(BudgetState(), 100.0, quota)
    state, second = reserve(state, 100.0, quota)
    assert (first, second) == (100.0, pytest.approx(103.05))
    state = pause(state, 101.0, 30)  # a 429 with Retry-After: 30
    state, third = reserve(state, 101.0, quota)
    assert third == 131.0
    slow = BudgetState(factor=0.5)
    _, a = reserve(slow, 0, quota)
    assert reserve(reserve(slow, 0, quota)[0], 0, quota)[1] - a == pytest.approx(6.1)
    assert Quota(1, 1, 0.1).budget == 1  # at least one request per window


def test_quota_headers():
    q = Quota(100, 10, 0.5)
    assert hint_from_headers({"Sforce-Limit-Info": "api-usage=10/1000"}, q).factor == 1.0
    assert hint_from_headers({"Sforce-Limit-Info": "api-usage=450/1000"}, q).factor == 0.5
    assert hint_from_headers({"Sforce-Limit-Info": "api-usage=600/1000"}, q).factor == 0.1
    hs = {"X-HubSpot-RateLimit-Max": "190", "X-HubSpot-RateLimit-Remaining": "180",
          "X-HubSpot-RateLimit-Interval-Milliseconds": "10000"}
    hint = hint_from_headers(hs, q)
    assert hint.quota == Quota(190, 10, 0.5) and hint.factor == 1.0 and hint.pause_seconds == 0
    assert hint_from_headers({**hs, "X-HubSpot-RateLimit-Remaining": "19"}, q).factor == pytest.approx(19 / 95)
    # At share 0.8 our own 80 of 100 leave 20: 30 remaining is no sign of others, so no slowing down.
    mostly_ours = {**hs, "X-HubSpot-RateLimit-Max": "100", "X-HubSpot-RateLimit-Remaining": "30"}
    assert hint_from_headers(mostly_ours, Quota(100, 10, 0.8)).factor == 1.0
    exhausted = hint_from_headers({**hs, "X-HubSpot-RateLimit-Remaining": "0"}, q)
    assert exhausted.pause_seconds == 10
    assert hint_from_headers({"Content-Type": "application/json"}, q) is None
    assert hint_from_headers({"X-HubSpot-RateLimit-Max": "x", "X-HubSpot-RateLimit-Remaining": "1"}, q) is None


def test_retry_after():
    assert retry_after_seconds("7", 0, 1) == 7
    assert retry_after_seconds(None, 0, 3) == 3
    assert retry_after_seconds("soon", 0, 3) == 3
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:10 GMT", 1445412480, 1) == 10
    # Capped: an epoch sent where seconds belong, a date decades away, infinity.
    assert retry_after_seconds("1732531200", 0, 1) == 300
    assert retry_after_seconds("Fri, 31 Dec 2100 23:59:59 GMT", 1445412480, 1, cap=60) == 60
    assert retry_after_seconds("inf", 0, 3) == 3 and retry_after_seconds("1e400", 0, 3) == 3


def test_a_stored_pause_beyond_the_cap_is_held_to_it():
    quota = Quota(40, 60, 0.5)
    stalled = BudgetState(next_slot=3.5e9, paused_until=3.5e9)  # written before the cap existed
    state, start = reserve(stalled, 100.0, quota, max_pause=300)
    assert state.paused_until == 400.0 and start == pytest.approx(400.0 + quota.interval())  # one slot late
    assert state.next_slot == pytest.approx(start + quota.interval())


def test_time_key_and_typed_values():
    assert time_key("2024-01-01T00:00:00.000+0000") == time_key("2024-01-01T00:00:00Z")
    assert time_key("2024-01-01T00:00:01Z") > time_key("2024-01-01T00:00:00.999Z")
    assert typed("12.50", "numeric") == Decimal("12.50")
    assert typed("12.5", "integer") is None and typed("12", "bigint") == 12
    assert typed("true", "boolean") is True and typed("maybe", "boolean") is None
    assert typed("not a date", "timestamptz") is None and typed({"a": 1}, "text") == '{"a": 1}'
    assert typed(None, "text") is None


BASE = """
source: {dsn: x}
api_sources:
  - name: sf
    type: salesforce
    base_url: https://example.my.salesforce.com
    auth: {type: oauth_client_credentials, client_id_env: SF_ID, client_secret_env: SF_SECRET}
    rate_limit: {requests: 100, per_seconds: 10}
    collections:
      - {name: Account, table: crm.accounts, fields: {Name: text}}
"""


def error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "cdc.yaml", {})
    return str(info.value)


def test_api_sources_config_defaults_and_api_only_pipeline():
    cfg = parse_config(BASE, "cdc.yaml", {})
    [source] = cfg.api_sources
    assert source.rate_limit.share == 0.5 and source.rate_limit.budget == 50
    [coll] = source.collections
    assert (coll.id_field, coll.cursor_field, coll.table) == ("Id", "SystemModstamp", "crm.accounts")
    assert cfg.tables == [] and cfg.api_source("sf") is source
    hs = parse_config(BASE.replace("salesforce", "hubspot"), "cdc.yaml", {}).api_sources[0].collections[0]
    assert (hs.id_field, hs.cursor_field) == ("id", "hs_lastmodifieddate")
    with pytest.raises(ConfigError, match=r"unknown api source 'x' \(configured api sources: sf\)"):
        cfg.api_source("x")


def test_api_sources_config_errors_name_file_key_and_problem():
    assert error("source: {dsn: x}\n") == "cdc.yaml: tables: required key is missing"
    assert error("source: {dsn: x}\ntables: []\n") == "cdc.yaml: tables: must not be empty"
    secret = error(BASE.replace("client_secret_env: SF_SECRET", "client_secret_env: 's3cr3t-value!'"))
    assert secret == ("cdc.yaml: api_sources[0].auth.client_secret_env: must be the NAME of an environment "
                      "variable (e.g. HUBSPOT_TOKEN), never the secret itself")
    assert "s3cr3t" not in secret
    assert error(BASE.replace("https://example", "https://user:pw@example")) == (
        "cdc.yaml: api_sources[0].base_url: must be an http:// or https:// URL without credentials "
        "(use auth: with env vars)")
    lines = error(BASE.replace("{Name: text}", "{Name: txt, Record: jsonb}").replace("share", "x")
                  .replace("per_seconds: 10}", "per_seconds: 10, share: 1.5}")).splitlines()
    assert lines == [
        "cdc.yaml: api_sources[0].rate_limit.share: must be at most 1 (got 1.5)",
        "cdc.yaml: api_sources[0].collections[0].fields.Name: type must be one of text, integer, bigint, numeric, "
        "double precision, boolean, timestamptz, date, jsonb (got 'txt')",
        "cdc.yaml: api_sources[0].collections[0].fields.Record: column 'record' is reserved "
        "(id, modified_at, record, synced_at)",
    ]
    dup = BASE + "      - {name: Account, table: crm.other}\n      - {name: Lead, table: crm.accounts}\n"
    assert error(dup).splitlines() == [
        "cdc.yaml: api_sources[0].collections[1].name: duplicate collection 'Account' (also collections[0])",
        "cdc.yaml: api_sources[0].collections[2].table: table 'crm.accounts' is also the destination of "
        "collections[0]",
    ]
    assert error(BASE.replace("type: salesforce", "type: soap")).startswith(
        "cdc.yaml: api_sources[0].type: must be one of 'salesforce', 'hubspot'")
    two = BASE + BASE.split("api_sources:\n")[1].replace("crm.accounts", "crm.accounts")
    assert error(two).splitlines() == [
        "cdc.yaml: api_sources[1].name: duplicate api source 'sf' (also api_sources[0])"]
