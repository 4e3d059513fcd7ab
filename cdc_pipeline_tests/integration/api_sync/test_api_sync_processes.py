"""API sync as `cdc-pipeline api-sync` subprocesses: SIGKILL mid-backfill resumes from the checkpoint;
two processes at once share one budget and never exceed share x quota; SIGTERM stops cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import yaml

from cdc_pipeline_tests.api_fakes import T0, FakeApi
from cdc_pipeline_tests.helpers import wait_until
from cdc_pipeline_tests.integration.api_sync.test_api_sync import api_config, rest_source, sf_source, table


def _start(config_path: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "cdc_pipeline.cli", "--config", str(config_path), "api-sync", *args],
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigkill_mid_backfill_resumes_from_checkpoint(source_db, tmp_path):
    with FakeApi("salesforce") as api:
        for i in range(600):
            api.put("Account", f"001{i:012d}", at=T0.replace(minute=i // 50), Name=f"a{i}")
        source = sf_source(api, [{"name": "Account", "table": "crm.accounts", "fields": {"Name": "text"},
                                  "page_size": 20}])
        source["rate_limit"] = {"requests": 20, "per_seconds": 2, "share": 0.5}  # 10 pages / 2 s
        path = tmp_path / "cdc.yaml"
        path.write_text(yaml.safe_dump(api_config(source_db.dsn, source)))
        env = {"SF_ID": api.client_id, "SF_SECRET": api.client_secret}
        proc = _start(path, env)

        def checkpointed() -> int:
            rows = source_db.execute("SELECT backfill_records FROM cdc_pipeline.api_sync_collections") \
                if source_db.execute("SELECT to_regclass('cdc_pipeline.api_sync_collections')")[0][0] else []
            return int(rows[0][0]) if rows else 0

        wait_until(lambda: checkpointed() >= 200, 120, "200 records checkpointed")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        at_kill = checkpointed()
        served_before = len(api.data_log())
        assert 200 <= at_kill < 600

        proc = _start(path, env, "--until-idle")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert re.search(r"api source sf: \d+ records written", out)
        first_after = api.data_log()[served_before]
        assert " WHERE SystemModstamp > " in first_after.query, "the restart began again from the start"
        assert len(table(source_db, "crm.accounts")) == 600
        served = Counter(i for e in api.data_log() for i in e.ids)
        # Each record fetched once, except at most the page that was in flight at the kill.
        assert sum(n - 1 for n in served.values()) <= 20
        assert not [i for i in served if i < first_after.ids[0] and served[i] > 1 and i not in
                    api.data_log()[served_before - 1].ids]


def test_two_processes_share_the_budget_and_stop_on_sigterm(source_db, tmp_path):
    with FakeApi("rest") as api:
        for name in ("a", "b", "c", "d"):
            for i in range(400):
                api.put(name, f"{i:04d}", v=i)
        source = rest_source(api, [{"name": n, "table": f"api.{n}", "page_size": 10} for n in ("a", "b", "c", "d")])
        source["rate_limit"] = {"requests": 20, "per_seconds": 2, "share": 0.5}  # 10 requests per 2 s
        path = tmp_path / "cdc.yaml"
        path.write_text(yaml.safe_dump(api_config(source_db.dsn, source)))
        env = {"REST_TOKEN": api.bearer}
        procs = [_start(path, env) for _ in range(2)]
        # Three budgets' worth of requests (about 6 s at the budget's pace): waited for, not slept for.
        wait_until(lambda: len(api.data_log()) >= 30, 180, "30 requests")
        for p in procs:
            p.send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=20) for p in procs]
        for p, (out, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, err
            assert re.search(r"api source tickets: \d+ records written", out)
        # Both processes worked (each took some collections), yet the API never saw more than the budget.
        assert all(re.search(r"\((\w, )*\w\)", out) for out, _ in outs)
        assert api.max_in_window(2.0) <= 10
