"""`spark.conf` values (issue 15.5) never reach Dagster's repository or job snapshots: the Spark session is
built at run time from the config file."""

from __future__ import annotations

from dagster._core.remote_representation.external_data import RepositorySnap
from dagster._serdes import serialize_value

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.defs import build_definitions
from cdc_pipeline_tests.helpers import mirror_config

SECRET = "s3aSecretKeyValue123"


def test_spark_conf_secret_not_in_snapshots(source_db, db_factory, write_config, tmp_path, monkeypatch):
    monkeypatch.setenv("CDC_S3A_SECRET", SECRET)
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    data["spark"]["conf"] = {"spark.hadoop.fs.s3a.secret.key": "${CDC_S3A_SECRET}"}
    config = write_config(data)
    setup(config)
    defs = build_definitions(str(tmp_path / "cdc.yaml"))
    repo = defs.get_repository_def()
    assert SECRET not in serialize_value(RepositorySnap.from_def(repo))
    for job in repo.get_all_jobs():
        assert SECRET not in serialize_value(job.get_job_snapshot())
    # At run time the resource builds the session with the conf.
    session = defs.resources["pyspark"].spark_session
    assert session.conf.get("spark.hadoop.fs.s3a.secret.key") == SECRET
