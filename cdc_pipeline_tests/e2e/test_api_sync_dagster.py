"""API sync through Dagster: the collection's asset run backfills it (observations while it runs,
metadata at the end), the lag check passes, and fails against a too-tight ceiling."""

from __future__ import annotations

import time

from dagster import AssetKey, DagsterInstance, build_asset_check_context

from cdc_pipeline.defs import build_definitions
from cdc_pipeline.defs.api_sync import CHECK_NAME
from cdc_pipeline_tests.api_fakes import FakeApi
from cdc_pipeline_tests.integration.api_sync.test_api_sync import api_config, rest_source


def test_api_sync_asset_run_metadata_and_lag_check(source_db, write_config, tmp_path, monkeypatch):
    with FakeApi("rest") as api:
        monkeypatch.setenv("REST_TOKEN", api.bearer)
        for i in range(60):
            api.put("tickets", f"{i:03d}", subject=f"s{i}")
        source = rest_source(api, [{"name": "tickets", "table": "support.tickets", "page_size": 10,
                                    "fields": {"subject": "text"}}], max_lag_seconds=30)
        write_config(api_config(source_db.dsn, source))
        defs = build_definitions(str(tmp_path / "cdc.yaml"))
        key = AssetKey(["api_sync", "tickets", "tickets"])
        job = defs.resolve_job_def("api_sync_tickets")
        with DagsterInstance.ephemeral() as instance:
            run = job.execute_in_process(instance=instance, run_config={
                "ops": {"api_sync__tickets__tickets": {"config": {"progress_seconds": 0.2}}}})
            assert run.success
            [mat] = [e.materialization for e in run.get_asset_materialization_events()]
            assert mat.asset_key == key
            meta = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
            assert meta["phase"] == "sync" and meta["records_synced"] == 60 and meta["backfill_progress"] == 1.0
            assert meta["requests_used_of_budget"].endswith("/50 per 2 s")
            observations = [e for e in run.all_events if e.event_type_value == "ASSET_OBSERVATION"]
            assert observations, "no progress while the backfill ran"

        assert source_db.execute("SELECT count(*) FROM support.tickets")[0][0] == 60
        checks = [c for c in defs.asset_checks if any(s.name == CHECK_NAME for s in c.check_specs)]
        [check] = checks
        assert check(build_asset_check_context(resources={"cdc": defs.resources["cdc"]})).passed
        time.sleep(0.1)  # the lag grows while nothing polls
        tight = write_config(api_config(source_db.dsn, {**source, "max_lag_seconds": 0.05}))
        tight_defs = build_definitions(str(tight.path))
        [tight_check] = [c for c in tight_defs.asset_checks if any(s.name == CHECK_NAME for s in c.check_specs)]
        result = tight_check(build_asset_check_context(resources={"cdc": tight_defs.resources["cdc"]}))
        assert not result.passed and result.metadata["ceiling_seconds"].value == 0.05
