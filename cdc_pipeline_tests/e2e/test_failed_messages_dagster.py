"""Failed messages operated through Dagster: the sink's `no_stale_parked_messages` check (executed by hand)
WARNs as soon as a message is parked, lists it (ID, table, key, error) as table metadata and turns ERROR
past max_parked_age_seconds; the retry job, given the ID from that table, makes it due again and the next
delivery sends it; the discard job and a bad run config. The fault is real: the mirror rejects a key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from dagster import AssetCheckKey, AssetCheckSeverity, AssetKey, DagsterInstance

from cdc_pipeline.defs.health import PARKED_CHECK
from cdc_pipeline_tests.helpers import deliver, drain, wait_until
from cdc_pipeline_tests.integration.delivery.test_parking import _parked, _prepare

SINK = AssetKey(["sink", "mirror"])


def _defs(path: Path) -> Any:
    from cdc_pipeline.defs import build_definitions

    return build_definitions(str(path))


def execute_parked_check(defs: Any, instance: DagsterInstance) -> Any:
    """What the Checks tab's Execute button runs: the implicit asset job with only the check selected."""
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection=set(), asset_check_selection={AssetCheckKey(SINK, PARKED_CHECK)})
    result = job.execute_in_process(instance=instance)
    [evaluation] = result.get_asset_check_evaluations()
    return evaluation


def test_parked_messages_listed_by_the_check_and_retried_by_the_job(source_db, db_factory, write_config, spark,
                                                                    tmp_path):
    dest = db_factory()
    config = _prepare(source_db, dest, write_config)
    source_db.execute("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 5) g")
    source_db.execute("UPDATE acct SET balance = 1 WHERE id = 7 OR id = 3")  # 7 has no row: nothing parked
    source_db.execute("INSERT INTO acct VALUES (7, 5)")  # rejected by the mirror's constraint
    drain(config)
    deliver(config, spark)
    [(lsn, idx, status, _)] = _parked(config)
    defs = _defs(tmp_path / "cdc.yaml")
    with DagsterInstance.ephemeral() as instance:
        evaluation = execute_parked_check(defs, instance)
        assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.WARN
        [row] = evaluation.metadata["parked_messages"].value.records
        assert row.data["id"] == f"{lsn}:{idx}" and row.data["table"] == "public.acct"
        assert row.data["key"] and "poison" in row.data["error"] and row.data["attempts"] >= 1
        assert row.data["lsn"] == f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}:{idx}"

        # A config naming nothing (or two things) fails with a clear message; nothing changes.
        bad = defs.resolve_job_def("retry_failed_messages_mirror").execute_in_process(
            instance=instance, raise_on_error=False,
            run_config={"ops": {"retry_failed_mirror": {"config": {"all": True, "table": "public.acct"}}}})
        assert not bad.success
        assert "exactly one of ids, table or all" in str(bad.failure_data_for_node("retry_failed_mirror"))

        dest.execute("ALTER TABLE mirror.acct DROP CONSTRAINT poison")
        run = defs.resolve_job_def("retry_failed_messages_mirror").execute_in_process(
            instance=instance, run_config={"ops": {"retry_failed_mirror": {"config": {"ids": [row.data["id"]]}}}})
        assert run.success
        stats = deliver(config, spark)
        assert stats.retried == 1 and _parked(config) == []
        assert dict(dest.execute("SELECT id, balance FROM mirror.acct"))[7] == 5
        assert execute_parked_check(defs, instance).passed


def test_stale_parked_message_is_an_error_and_discard_by_table(source_db, db_factory, write_config, spark,
                                                               tmp_path):
    dest = db_factory()
    config = _prepare(source_db, dest, write_config)
    data = yaml.safe_load((tmp_path / "cdc.yaml").read_text())
    (tmp_path / "cdc.yaml").write_text(yaml.safe_dump({**data, "delivery": {"max_parked_age_seconds": 1}}))
    source_db.execute("INSERT INTO acct VALUES (7, 5)")
    drain(config)
    deliver(config, spark)
    assert len(_parked(config)) == 1
    wait_until(lambda: source_db.execute("SELECT now() - first_failed_at > interval '1.2 s' "
                                         "FROM cdc_pipeline.failed_messages")[0][0], 30, "the message parked for 1 s")
    defs = _defs(tmp_path / "cdc.yaml")
    with DagsterInstance.ephemeral() as instance:
        evaluation = execute_parked_check(defs, instance)
        assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.ERROR
        run = defs.resolve_job_def("discard_failed_messages_mirror").execute_in_process(
            instance=instance,
            run_config={"ops": {"discard_failed_mirror": {"config": {"table": "public.acct"}}}})
        assert run.success
        assert [p[2] for p in _parked(config)] == ["discarded"]
        assert execute_parked_check(defs, instance).passed
