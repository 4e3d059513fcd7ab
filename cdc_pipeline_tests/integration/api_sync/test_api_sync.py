"""API sync against fake APIs served as real local HTTP servers, into a real PostgreSQL."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from cdc_pipeline.api_sync import lag
from cdc_pipeline.api_sync.loop import ApiSync
from cdc_pipeline_tests.api_fakes import T0, FakeApi


def api_config(dsn: str, source: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"source": {"dsn": dsn}, "api_sources": [source], **extra}


def sf_source(api: FakeApi, collections: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"name": "sf", "type": "salesforce", "base_url": api.url,
            "auth": {"type": "oauth_client_credentials", "client_id_env": "SF_ID", "client_secret_env": "SF_SECRET"},
            "rate_limit": {"requests": 200, "per_seconds": 2, "share": 0.5}, "collections": collections, **kw}


def table(db, name: str) -> dict[str, dict[str, Any]]:  # noqa: ANN001
    return {r[0]: r[1] for r in db.execute(f"SELECT id, record FROM {name}")}


@pytest.fixture
def sf_env(monkeypatch):  # noqa: ANN001, ANN201
    def setenv(api: FakeApi) -> None:
        monkeypatch.setenv("SF_ID", api.client_id)
        monkeypatch.setenv("SF_SECRET", api.client_secret)
    return setenv


def test_salesforce_backfill_ties_changes_deletes_and_token_refresh(source_db, write_config, sf_env):
    with FakeApi("salesforce") as api:
        sf_env(api)
        # 250 accounts, in runs of 30 sharing one SystemModstamp: every page boundary (page 40) cuts a tie.
        for i in range(250):
            api.put("Account", f"001{i:012d}", at=T0.replace(second=i // 30), Name=f"acct {i}", AnnualRevenue=i * 10.5)
        for i in range(30):
            api.put("Contact", f"003{i:012d}", Email=f"c{i}@x.org")
        config = write_config(api_config(source_db.dsn, sf_source(api, [
            {"name": "Account", "table": "crm.accounts", "fields": {"Name": "text", "AnnualRevenue": "numeric"},
             "page_size": 40},
            {"name": "Contact", "table": "crm.contacts", "fields": {"Email": "text"}, "page_size": 40},
        ])))
        ApiSync(config).run(until_idle=True, seconds=60)
        accounts = table(source_db, "crm.accounts")
        assert set(accounts) == set(api.live("Account")) and len(accounts) == 250
        served = Counter(i for e in api.data_log() if "FROM Account" in e.query for i in e.ids)
        assert max(served.values()) == 1, "a record was fetched twice across a tie"
        assert source_db.execute("SELECT name, annualrevenue FROM crm.accounts WHERE id = '001000000000007'") == [
            ("acct 7", 73.5)]
        assert len(table(source_db, "crm.contacts")) == 30

        api.put("Account", "001999999999999", Name="new")
        api.put("Account", "001000000000003", Name="renamed")
        api.delete("Account", "001000000000004")
        refreshes = api.token_requests

        def expire_once(collection: str) -> None:  # the session expires mid-sync: 401, then a new token
            api.on_request = None
            api.expire_tokens()

        api.on_request = expire_once
        ApiSync(config).run(until_idle=True, seconds=30)
        accounts = table(source_db, "crm.accounts")
        assert set(accounts) == set(api.live("Account")) and len(accounts) == 250
        assert accounts["001000000000003"]["Name"] == "renamed"
        assert api.token_requests == refreshes + 2 and api.unauthorized == 1
        figures = lag.collect(config)["sf"]["collections"]["Account"]
        assert figures["phase"] == "sync" and figures["backfill_progress"] == 1.0
        assert figures["records_deleted"] == 1 and figures["backfill_total"] == 250


def hs_source(api: FakeApi, collections: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"name": "hs", "type": "hubspot", "base_url": api.url, "auth": {"type": "bearer", "token_env": "HS_TOKEN"},
            "rate_limit": {"requests": 40, "per_seconds": 2, "share": 0.5}, "collections": collections, **kw}


def test_hubspot_429_burst_quota_headers_and_archived(source_db, write_config, monkeypatch):
    with FakeApi("hubspot", quota=(40, 2)) as api:
        monkeypatch.setenv("HS_TOKEN", api.bearer)
        for i in range(1, 121):
            api.put("contacts", str(i), at=T0.replace(minute=i // 25), email=f"u{i}@x.org", score=i)
        config = write_config(api_config(source_db.dsn, hs_source(api, [
            {"name": "contacts", "table": "crm.contacts", "fields": {"email": "text", "score": "integer"},
             "page_size": 25}], delete_check_seconds=0.5)))
        api.fail_429, api.retry_after = 6, "1"  # a burst of 429s at the start
        ApiSync(config).run(until_idle=True, seconds=60)
        rows = table(source_db, "crm.contacts")
        assert len(rows) == 120
        log = api.data_log()
        throttled = [e.at for e in log if e.status == 429]
        assert len(throttled) == 6
        for t in throttled:  # Retry-After honoured: nothing arrived within 1 s after any 429
            assert not [e for e in log if t < e.at < t + 0.95], "a request ignored Retry-After"
        assert source_db.execute("SELECT score FROM crm.contacts WHERE id = '7'") == [(7,)]
        figures = lag.collect(config)["hs"]
        assert figures["throttled"] == 6 and figures["budget_per_window"] == 20

        api.put("contacts", "500", email="new@x.org")
        api.put("contacts", "7", score=700)
        api.delete("contacts", "8")  # archived
        # Another client eats the quota: X-HubSpot-RateLimit-Remaining drops below our share; we slow down.
        api.hubspot_remaining_override = 5
        time.sleep(0.6)  # the archived objects are checked every delete_check_seconds
        ApiSync(config).run(until_idle=True, seconds=30)
        rows = table(source_db, "crm.contacts")
        assert set(rows) == set(api.live("contacts"))
        assert source_db.execute("SELECT score FROM crm.contacts WHERE id = '7'") == [(700,)]
        figures = lag.collect(config)["hs"]
        assert figures["factor"] == 0.25  # 5 left of our 20
        assert figures["collections"]["contacts"]["records_deleted"] == 1


def rest_source(api: FakeApi, collections: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"name": "tickets", "type": "rest", "base_url": api.url,
            "auth": {"type": "bearer", "token_env": "REST_TOKEN"},
            "rate_limit": {"requests": 100, "per_seconds": 2, "share": 0.5}, "collections": collections, **kw}


def test_rest_ties_across_pages_and_passes_and_id_sweep(source_db, write_config, monkeypatch):
    with FakeApi("rest") as api:
        monkeypatch.setenv("REST_TOKEN", api.bearer)
        same = T0.replace(hour=1)
        for i in range(95):  # all at one time: every page boundary and the pass boundary is a tie
            api.put("tickets", f"t{i:03d}", at=same, subject=f"s{i}")
        config = write_config(api_config(source_db.dsn, rest_source(api, [
            {"name": "tickets", "table": "support.tickets", "id_field": "id", "cursor_field": "updated_at",
             "fields": {"subject": "text"}, "page_size": 20}], delete_check_seconds=1)))
        ApiSync(config).run(until_idle=True, seconds=30)
        assert len(table(source_db, "support.tickets")) == 95
        # More records at the same time (the tie spans two passes), one update, one delete.
        for i in range(95, 100):
            api.put("tickets", f"t{i:03d}", at=same, subject=f"s{i}")
        api.put("tickets", "t001", subject="changed")
        api.delete("tickets", "t002")
        written = lag.collect(config)["tickets"]["collections"]["tickets"]["records_synced"]
        time.sleep(1.1)  # the full id sweep runs every delete_check_seconds
        ApiSync(config).run(until_idle=True, seconds=30)
        rows = table(source_db, "support.tickets")
        assert set(rows) == set(api.live("tickets")) and len(rows) == 99
        assert rows["t001"]["subject"] == "changed"
        figures = lag.collect(config)["tickets"]["collections"]["tickets"]
        # The 5 new and the 1 changed record, each written once: no tie repeated.
        assert figures["records_synced"] - written == 6
        assert figures["records_deleted"] == 1


def test_cli_setup_api_sync_until_idle_and_status(source_db, write_config, monkeypatch, capsys):
    import json

    from cdc_pipeline.cli import main

    with FakeApi("rest") as api:
        monkeypatch.setenv("REST_TOKEN", api.bearer)
        for i in range(30):
            api.put("tickets", f"{i:03d}", subject=f"s{i}")
        config = write_config(api_config(source_db.dsn, rest_source(api, [
            {"name": "tickets", "table": "support.tickets", "page_size": 10, "fields": {"subject": "text"}}])))
        assert main(["--config", str(config.path), "setup"]) == 0  # an API-only pipeline: no slot, no publication
        assert "created table support.tickets" in capsys.readouterr().out
        assert source_db.execute("SELECT count(*) FROM pg_replication_slots")[0][0] == 0
        assert main(["api-sync", "--config", str(config.path), "--source", "tickets", "--until-idle"]) == 0
        assert "api source tickets: 30 records written" in capsys.readouterr().out
        assert main(["--config", str(config.path), "status", "--json"]) == 0
        figures = json.loads(capsys.readouterr().out)["api_sync"]["tickets"]
        assert figures["collections"]["tickets"]["records_synced"] == 30
        assert figures["budget_per_window"] == 50 and figures["requests_in_window"] >= 4
        assert main(["--config", str(config.path), "status"]) == 0
        text = capsys.readouterr().out
        assert "api source tickets (rest):" in text and "tickets -> support.tickets: sync, 30 synced" in text
        assert main(["--config", str(config.path), "api-sync", "--source", "nope"]) == 2
        assert "unknown api source 'nope' (configured api sources: tickets)" in capsys.readouterr().err


def test_added_field_or_collection_backfills_that_collection_only(source_db, write_config, sf_env):
    with FakeApi("salesforce") as api:
        sf_env(api)
        for i in range(50):
            api.put("Account", f"001{i:012d}", Name=f"a{i}", Industry="Retail")
            api.put("Lead", f"00Q{i:012d}", Company=f"c{i}")
        accounts = {"name": "Account", "table": "crm.accounts", "fields": {"Name": "text"}, "page_size": 20}
        leads = {"name": "Lead", "table": "crm.leads", "fields": {"Company": "text"}, "page_size": 20}
        config = write_config(api_config(source_db.dsn, sf_source(api, [accounts])))
        ApiSync(config).run(until_idle=True, seconds=30)
        assert "industry" not in {r[0] for r in source_db.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'accounts'")}

        accounts["fields"] = {"Name": "text", "Industry": "text"}  # a field added, a collection added
        config = write_config(api_config(source_db.dsn, sf_source(api, [accounts, leads])))
        seen = len(api.data_log())
        ApiSync(config).run(until_idle=True, seconds=30)
        queries = [e.query for e in api.data_log()[seen:]]
        first = {name: next(q for q in queries if f"FROM {name}" in q and "COUNT()" not in q)
                 for name in ("Account", "Lead")}
        assert " WHERE " not in first["Account"] and " WHERE " not in first["Lead"]  # both from the start
        assert source_db.execute("SELECT count(*) FROM crm.accounts WHERE industry = 'Retail'")[0][0] == 50
        assert len(table(source_db, "crm.leads")) == 50

        leads["fields"] = {"Company": "text", "Status": "text"}  # only Lead changes now
        config = write_config(api_config(source_db.dsn, sf_source(api, [accounts, leads])))
        seen = len(api.data_log())
        ApiSync(config).run(until_idle=True, seconds=30)
        queries = [e.query for e in api.data_log()[seen:]]
        assert all(" WHERE " in q for q in queries if "FROM Account" in q)  # Account just polls on
        assert any("FROM Lead" in q and " WHERE " not in q and "COUNT()" not in q for q in queries)


def test_added_field_is_filled_where_the_api_record_is_unchanged(source_db, write_config, monkeypatch):
    with FakeApi("rest") as api:  # REST records carry every field anyway: only the typed column is new
        monkeypatch.setenv("REST_TOKEN", api.bearer)
        for i in range(15):
            api.put("tickets", f"{i:03d}", subject=f"s{i}", priority=i)
        coll = {"name": "tickets", "table": "support.tickets", "fields": {"subject": "text"}, "page_size": 10}
        config = write_config(api_config(source_db.dsn, rest_source(api, [coll])))
        ApiSync(config).run(until_idle=True, seconds=30)
        coll["fields"] = {"subject": "text", "priority": "integer"}
        config = write_config(api_config(source_db.dsn, rest_source(api, [coll])))
        ApiSync(config).run(until_idle=True, seconds=30)
        assert source_db.execute("SELECT count(*) FROM support.tickets WHERE priority IS NOT NULL")[0][0] == 15
        assert source_db.execute("SELECT priority FROM support.tickets WHERE id = '007'") == [(7,)]
