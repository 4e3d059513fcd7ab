"""The lake sinks on an object store: Delta at an `s3://` path and an Iceberg warehouse at an `s3://` URL,
both on moto's S3 server (real HTTP, S3's protocol), credentials given as `${VAR}`. A mirror written under
inserts, updates and deletes, read back with the format's own reader from the bucket, equals the source;
the secret is in no log line."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests.helpers import drain
from cdc_pipeline_tests.integration.sinks.test_sink_lake import deliver, source_rows
from cdc_pipeline_tests.lake import lake_config
from cdc_pipeline_tests.servers import MotoServer, unique

SECRET = "lake-s3cret-value"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[MotoServer, str]]:
    server = MotoServer()
    server.start()
    bucket = unique("lake-")
    server.client("s3").create_bucket(Bucket=bucket)
    monkeypatch.setenv("CDC_TEST_LAKE_SECRET", SECRET)
    try:
        yield server, bucket
    finally:
        server.stop()


def _destination(fmt: str, server: MotoServer, bucket: str) -> dict[str, Any]:
    if fmt == "delta":
        return {"path": f"s3://{bucket}/delta", "storage_options": {
            "AWS_ENDPOINT_URL": server.url, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "${CDC_TEST_LAKE_SECRET}",
            "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}}  # one writer: a sink without lanes
    return {"warehouse": f"s3://{bucket}/warehouse", "catalog": {"type": "sql", "properties": {
        "s3.endpoint": server.url, "s3.region": "us-east-1", "s3.access-key-id": "test",
        "s3.secret-access-key": "${CDC_TEST_LAKE_SECRET}"}}}


def _read(config: Any) -> dict[int, tuple[int, int]]:
    dest = config.sink("lake").destination
    name = dest.table_for("public.ev")
    if dest.type == "delta":
        from deltalake import DeltaTable

        table = DeltaTable(f"{dest.path}/{name}", storage_options=dict(dest.storage_options)).to_pyarrow_table()
    else:
        from cdc_pipeline.sinks.iceberg.catalog import load_catalog

        namespace, _, table_name = name.rpartition(".")
        table = load_catalog(dest, config.state_dsn, config.state.schema_name).load_table(
            (namespace or "default", table_name)).scan().to_arrow()
    return {r["id"]: (r["id"], r["v"]) for r in table.to_pylist()}


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_mirror_on_an_object_store_equals_the_source(fmt, s3, source_db, write_config, tmp_path, caplog):
    server, bucket = s3
    source_db.execute("CREATE TABLE ev (id int PRIMARY KEY, v int)")
    config = write_config(lake_config(source_db.dsn, ["public.ev"], fmt, "mirror", tmp_path,
                                      **_destination(fmt, server, bucket)))
    setup(config)
    caplog.set_level(logging.DEBUG)
    source_db.execute("INSERT INTO ev SELECT g, g FROM generate_series(1, 30) g")
    drain(config)
    deliver(config)
    source_db.execute("UPDATE ev SET v = v * 10 WHERE id % 3 = 0")
    source_db.execute("DELETE FROM ev WHERE id % 5 = 0")
    drain(config)
    deliver(config)
    assert _read(config) == source_rows(source_db.dsn, "SELECT id, v FROM ev")
    keys = [o["Key"] for o in server.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert any(k.endswith(".parquet") for k in keys)  # the data is in the bucket, not on local disk
    assert SECRET not in caplog.text
