"""Mistyped DSNs (issue 15.4) through the real console script: `check`, `setup`, `deliver`, `status` and
`failed list` fail with a fixed message that names the setting and never prints the password."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from psycopg import conninfo

from cdc_pipeline_tests.helpers import mirror_config

CLI = str(Path(sys.executable).with_name("cdc-pipeline"))
SECRET = "S3cr%zzPw"
ONLY_PASSWORD = "S3cretPwOnly"


def _url_with(dsn: str, password: str) -> str:
    """A URL DSN for the same server, with a password that libpq cannot parse (stray %)."""
    p = conninfo.conninfo_to_dict(dsn)
    host = p.get("host", "localhost")
    return f"postgresql://{p.get('user', 'postgres')}:{password}@/{p['dbname']}?host={host}&port={p.get('port', 5432)}"


@pytest.mark.parametrize("verb", [["check"], ["setup"], ["drain", "--until-idle"], ["deliver", "--until-idle"], ["status"],
                                  ["failed", "list"]])
@pytest.mark.parametrize("where", ["source", "sink"])
@pytest.mark.parametrize("mistake", ["stray_percent", "only_password"])
def test_mistyped_dsn_never_prints_the_password(source_db, db_factory, tmp_path, verb, where, mistake):
    dest = db_factory()
    bad = _url_with(source_db.dsn, SECRET) if mistake == "stray_percent" else "${CDC_TEST_PW}"
    data = mirror_config(source_db.dsn, dest.dsn, ["public.t"])
    if where == "source":
        data["source"]["dsn"] = bad
    else:
        data["sinks"][0]["destination"]["dsn"] = bad
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(data))
    env = {**os.environ, "CDC_TEST_PW": ONLY_PASSWORD}
    proc = subprocess.run([CLI, "--config", str(path), *verb], capture_output=True, text=True, timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    for leak in ("S3cr", "zzPw", ONLY_PASSWORD):
        assert leak not in out, out
    where_key = "source.dsn" if where == "source" else "sinks[0].destination.dsn"
    assert where_key in out and "not a valid PostgreSQL connection string" in out, out


def test_failed_list_masks_a_password_in_a_stored_error(source_db, db_factory, write_config, tmp_path):
    from cdc_pipeline.admin.setup import setup
    from cdc_pipeline.state.failed_messages import FailedMessages

    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"]))
    setup(config)
    leak = "OperationalError: connection to postgresql://u:Hunter2Secret@db.example/x failed; password=Hunter2Secret"
    with source_db.connect() as conn:
        FailedMessages("cdc_pipeline").park(conn, "mirror", [((1, 0), None, leak, 1)], [0])
        # A row stored before masking existed (or by another writer) is masked on the way out too.
        conn.execute("INSERT INTO cdc_pipeline.failed_messages (sink, commit_lsn, commit_idx, attempts, last_error, "
                     "next_attempt_at) VALUES ('mirror', 2, 0, 1, %s, now())", (leak,))
    for extra in ([], ["--json"]):
        proc = subprocess.run([CLI, "--config", str(config.path), "failed", "list", *extra], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "Hunter2Secret" not in proc.stdout + proc.stderr
        assert proc.stdout.count("password=***") == 2 and "u:***@db.example" in proc.stdout


def test_dagster_step_error_is_masked():
    """The Dagster step thread re-raises the work's error: a libpq parse error quoting the password is masked
    and its cause (which quotes it too) is not chained."""
    import psycopg

    from cdc_pipeline.defs.streaming import stream_while

    def work() -> None:
        psycopg.connect("postgresql://u:S3cr%zzPw@/db")

    with pytest.raises(Exception) as info:
        list(stream_while("w", work, lambda: None, lambda: [], 10.0, lambda exc: None))
    text = "".join(__import__("traceback").format_exception(info.value))
    assert "S3cr" not in text and "zzPw" not in text and "invalid percent-encoded token" in text


def test_stray_percent_dsn_fails_at_load_with_a_fixed_message():
    from cdc_pipeline.config import ConfigError
    from cdc_pipeline.config.loading import parse_config

    text = "source: {dsn: 'postgresql://u:S3cr%zzPw@db/x'}\ntables: [{name: t}]\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "cdc.yaml", {})
    assert "S3cr" not in str(info.value) and "zzPw" not in str(info.value)
    assert str(info.value).startswith("cdc.yaml: source.dsn: is not a valid PostgreSQL connection string")
