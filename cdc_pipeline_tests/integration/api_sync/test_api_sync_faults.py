"""API sync against hostile or broken APIs, through `cdc-pipeline api-sync` subprocesses: a Retry-After
decades away is capped (and shown), a missing token variable is a config error at start, an API that
refuses every credential is a permanent error, and response bodies never leak token-shaped text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from cdc_pipeline.api_sync import lag
from cdc_pipeline.api_sync.loop import ApiSync
from cdc_pipeline.config import load_config
from cdc_pipeline.defs.api_sync import collection_metadata
from cdc_pipeline_tests.api_fakes import FakeApi
from cdc_pipeline_tests.integration.api_sync.test_api_sync import api_config, rest_source, sf_source


def cli(path: Path, env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """One `cdc-pipeline` run; a run that outlives ``timeout`` fails the test (it would have hung)."""
    full = {k: v for k, v in os.environ.items() if k not in ("REST_TOKEN", "SF_ID", "SF_SECRET")}
    return subprocess.run([sys.executable, "-m", "cdc_pipeline.cli", "--config", str(path), *args],
                          env={**full, **env}, capture_output=True, text=True, timeout=timeout)


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def tickets(api: FakeApi, n: int = 5, **kw: Any) -> dict[str, Any]:
    for i in range(n):
        api.put("tickets", f"{i:03d}", subject=f"s{i}")
    return rest_source(api, [{"name": "tickets", "table": "support.tickets", "page_size": 10,
                              "fields": {"subject": "text"}}], **kw)


def test_retry_after_decades_away_is_capped_shown_and_seconds_holds(source_db, tmp_path):
    with FakeApi("rest") as api:
        source = tickets(api)
        path = write(tmp_path, api_config(source_db.dsn, source))
        env = {"REST_TOKEN": api.bearer}
        api.fail_429, api.retry_after = 1, "1732531200"  # an epoch where seconds belong: 55 years
        started = time.monotonic()
        run = cli(path, env, "api-sync", "--seconds", "4")
        assert run.returncode == 0, run.stderr
        first = api.data_log()[0].at
        assert time.monotonic() - first < 4 + 3, "--seconds overran its limit"
        assert time.monotonic() - started < 60
        status = cli(path, env, "status", "--json")
        figures = json.loads(status.stdout)["api_sync"]["tickets"]
        assert 250 < figures["paused_for_seconds"] <= 300  # the documented cap: 300 s
        text = cli(path, env, "status").stdout
        assert "paused for" in text and "Retry-After" in text
        meta = collection_metadata(load_config(path), "tickets", "tickets")
        assert 250 < meta["paused_for_seconds"].value <= 300

        # A far-future HTTP date is capped as well; the cap is a setting, and a pause stored by an older
        # version (a year away) is held to it too, across restarts.
        source["rate_limit"]["max_retry_after_seconds"] = 1
        path = write(tmp_path, api_config(source_db.dsn, source))
        source_db.execute("UPDATE cdc_pipeline.api_sync_budget SET paused_until = paused_until + 3e7")
        api.fail_429, api.retry_after = 1, "Fri, 31 Dec 2100 23:59:59 GMT"
        run = cli(path, env, "api-sync", "--until-idle", timeout=60)
        assert run.returncode == 0, run.stderr
        assert "5 records written" in run.stdout
        assert len(api.data_log(429)) == 2


def test_missing_token_variable_exits_2_at_start(source_db, tmp_path):
    with FakeApi("rest") as api:
        path = write(tmp_path, api_config(source_db.dsn, tickets(api)))
        run = cli(path, {}, "api-sync", "--until-idle", timeout=30)
        assert run.returncode == 2, (run.returncode, run.stderr)
        assert "environment variable REST_TOKEN is not set" in run.stderr
        assert "export REST_TOKEN" in run.stderr  # the fix
        assert api.data_log() == []
    with FakeApi("salesforce") as api:
        api.put("Account", "001000000000001", Name="a")
        path = write(tmp_path, api_config(source_db.dsn, sf_source(api, [
            {"name": "Account", "table": "crm.accounts", "fields": {"Name": "text"}}])))
        run = cli(path, {"SF_ID": api.client_id}, "api-sync", "--seconds", "30", timeout=30)
        assert run.returncode == 2 and "environment variable SF_SECRET is not set" in run.stderr
        assert api.token_requests == 0


def test_credentials_refused_for_everything_is_permanent(source_db, tmp_path):
    with FakeApi("rest") as api:
        path = write(tmp_path, api_config(source_db.dsn, tickets(api)))
        for args in (["--until-idle"], ["--seconds", "20"]):
            started = time.monotonic()
            run = cli(path, {"REST_TOKEN": "wrong-token-value"}, "api-sync", *args, timeout=40)
            assert run.returncode == 1, (args, run.returncode, run.stderr)
            assert "401" in run.stderr and "REST_TOKEN" in run.stderr, run.stderr
            assert "wrong-token-value" not in run.stderr
            assert time.monotonic() - started < 15  # not retried for the whole --seconds
        assert api.unauthorized <= 2
    with FakeApi("salesforce") as api:
        api.put("Account", "001000000000001", Name="a")
        path = write(tmp_path, api_config(source_db.dsn, sf_source(api, [
            {"name": "Account", "table": "crm.accounts", "fields": {"Name": "text"}}])))
        env = {"SF_ID": api.client_id, "SF_SECRET": api.client_secret}
        api.reject_tokens = True  # a token is issued, and refused: after the one refresh, give up
        run = cli(path, env, "api-sync", "--seconds", "20", timeout=40)
        assert run.returncode == 1 and "401" in run.stderr and "SF_ID" in run.stderr, run.stderr
        assert api.token_requests == 2 and api.unauthorized == 2
        api.reject_tokens = False  # a wrong client secret: the token endpoint refuses it
        run = cli(path, {**env, "SF_SECRET": "nope"}, "api-sync", "--until-idle", timeout=40)
        assert run.returncode == 1 and "OAuth token request refused" in run.stderr, run.stderr
        assert "SF_SECRET" in run.stderr


def test_error_bodies_never_echo_token_shapes(source_db, tmp_path):
    with FakeApi("rest") as api:
        path = write(tmp_path, api_config(source_db.dsn, tickets(api)))
        api.fail_with = (400, "bad request; token: tk-live-0123456789 Authorization: Bearer abc api_key: k-998877")
        run = cli(path, {"REST_TOKEN": api.bearer}, "api-sync", "--seconds", "3", timeout=40)
        status = cli(path, {"REST_TOKEN": api.bearer}, "status", "--json").stdout
        for text in (run.stderr, status):
            assert "tk-live-0123456789" not in text and "k-998877" not in text
        assert "answered 400" in run.stderr


def test_offset_cursor_sweep_keeps_a_row_shifted_into_a_read_page(source_db, write_config, monkeypatch):
    """An API whose page tokens are offsets: a delete on an already-read page shifts the next page's
    first row into the read page, so that sweep never sees it. It must not be deleted for that."""
    with FakeApi("rest") as api:
        monkeypatch.setenv("REST_TOKEN", api.bearer)
        api.offset_cursors = True
        for i in range(30):
            api.put("tickets", f"{i:03d}", subject=f"s{i}")
        source = rest_source(api, [{"name": "tickets", "table": "support.tickets", "page_size": 5,
                                    "fields": {"subject": "text"}}], delete_check_seconds=0.5)
        config = write_config(api_config(source_db.dsn, source))
        ApiSync(config).run(until_idle=True, seconds=60)
        assert source_db.execute("SELECT count(*) FROM support.tickets")[0][0] == 30

        def after_request(collection: str) -> None:
            if json.loads(api.data_log()[-1].query).get("cursor") == "5":  # a sweep's second page was read
                api.on_request = None
                api.delete("tickets", "000")  # on page one: "010" shifts from page three into page two

        api.on_request = after_request
        sync = ApiSync(config)
        runner = threading.Thread(target=sync.run, kwargs={"seconds": 120})
        runner.start()
        try:
            deadline = time.monotonic() + 90
            while source_db.execute("SELECT count(*) FROM support.tickets WHERE id = '000'")[0][0]:
                assert time.monotonic() < deadline, "the sweep never deleted 000"
                time.sleep(0.1)
            checks = len([e for e in api.data_log() if "updated_since" not in e.query])
            while len([e for e in api.data_log() if "updated_since" not in e.query]) < checks + 14:
                assert time.monotonic() < deadline + 60  # two more full sweeps after that
                time.sleep(0.1)
        finally:
            sync.stop()
            runner.join(30)
        rows = {r[0] for r in source_db.execute("SELECT id FROM support.tickets")}
        assert rows == set(api.live("tickets")) and "010" in rows
        assert lag.collect(config)["tickets"]["collections"]["tickets"]["records_deleted"] == 1
