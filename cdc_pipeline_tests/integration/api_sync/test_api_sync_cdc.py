"""API data onwards through CDC: API -> destination table (API sync) -> slot -> change log -> Spark ->
mirror sink. The one API sync test that runs Spark."""

from __future__ import annotations

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.api_sync.loop import ApiSync
from cdc_pipeline_tests.api_fakes import FakeApi
from cdc_pipeline_tests.helpers import assert_mirrored, mirror_config, sync
from cdc_pipeline_tests.integration.api_sync.test_api_sync import sf_source, table


def test_api_changes_flow_through_cdc_to_a_mirror(source_db, db_factory, write_config, spark, monkeypatch):
    dest = db_factory()
    with FakeApi("salesforce") as api:
        monkeypatch.setenv("SF_ID", api.client_id)
        monkeypatch.setenv("SF_SECRET", api.client_secret)
        for i in range(120):
            api.put("Opportunity", f"006{i:012d}", Name=f"deal {i}", Amount=i * 100, IsWon=i % 2 == 0)
        data = mirror_config(source_db.dsn, dest.dsn, ["crm.opportunities"])
        data["api_sources"] = [sf_source(api, [
            {"name": "Opportunity", "table": "crm.opportunities", "page_size": 50,
             "fields": {"Name": "text", "Amount": "numeric", "IsWon": "boolean"}}])]
        config = write_config(data)
        done = setup(config)  # creates the API table first, so the publication can include it
        assert any("created table crm.opportunities" in line for line in done)

        ApiSync(config).run(until_idle=True, seconds=60)
        sync(config, spark)
        assert assert_mirrored(source_db.dsn, "crm.opportunities", dest.dsn, "mirror.opportunities") == 120

        api.put("Opportunity", "006999999999999", Name="new deal", Amount=5, IsWon=False)
        api.put("Opportunity", "006000000000001", Amount=999)
        api.delete("Opportunity", "006000000000002")
        ApiSync(config).run(until_idle=True, seconds=60)
        assert set(table(source_db, "crm.opportunities")) == set(api.live("Opportunity"))
        sync(config, spark)
        assert assert_mirrored(source_db.dsn, "crm.opportunities", dest.dsn, "mirror.opportunities") == 120
        assert dest.execute("SELECT amount FROM mirror.opportunities WHERE id = '006000000000001'")[0][0] == 999
