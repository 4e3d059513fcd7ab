"""The logical-message stream is application input: whatever an application emits, under any prefix (the
pipeline's own included), with any content or size, transactional or not, the drain keeps streaming, every
table's changes arrive, nothing passes for the pipeline's own message, and unusable content under one of our
prefixes is logged by position and length (never its content), skipped and counted."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.capture.drain import Drain
from cdc_pipeline.capture.prefixes import OWN_PREFIXES, PROBE_PREFIX
from cdc_pipeline.ops.metrics import _own_counters
from cdc_pipeline_tests.helpers import assert_mirrored, deliver, mirror_config, wait_until
from cdc_pipeline_tests.processes import CLI

ANNOTATIONS = "cdc_pipeline:annotations"
EMIT = "SELECT pg_logical_emit_message(%s, %s, %s::bytea)"


def _pipeline(source_db, db_factory, write_config):  # type: ignore[no-untyped-def]
    dest = db_factory()
    for table in ("a", "b"):
        source_db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.a", "public.b"]))
    setup(config)
    return config, dest


def _logged(config) -> dict[str, int]:  # type: ignore[no-untyped-def]
    with psycopg.connect(config.state_dsn) as conn:
        return dict(conn.execute("SELECT table_name, count(*) FROM cdc_pipeline.change_log "
                                 "WHERE action = 'insert' GROUP BY 1").fetchall())


@pytest.mark.parametrize("prefix, content", [
    (ANNOTATIONS, b'{"n": 1e-20000}'),   # numeric cannot hold it: the COPY into the log used to fail
    (PROBE_PREFIX, b"\xff\xfe secret"),  # not UTF-8 under the probe's prefix: used to raise UnicodeDecodeError
    (ANNOTATIONS, b'{"secret": "' + b"x" * 70000 + b'"}'),  # over the size bound
])
def test_a_hostile_message_does_not_stop_the_cli_drain(prefix, content, source_db, db_factory, write_config,
                                                        tmp_path: Path):
    config, _ = _pipeline(source_db, db_factory, write_config)
    with source_db.connect() as conn:
        with conn.transaction():
            conn.execute("INSERT INTO a VALUES (1, 'before')")
            conn.execute(EMIT, (True, prefix, content))
            conn.execute("INSERT INTO b VALUES (1, 'after')")
        conn.execute(EMIT, (False, prefix, content))
        conn.execute("INSERT INTO a VALUES (2, 'later')")
    for _ in range(2):  # and again from where it stopped
        proc = subprocess.run([CLI, "--config", str(tmp_path / "cdc.yaml"), "drain", "--until-idle"],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        output = proc.stdout + proc.stderr
        assert "secret" not in output and "1e-20000" not in output and "xxxx" not in output
    assert _logged(config) == {"a": 2, "b": 1}
    with psycopg.connect(config.source.dsn) as conn:
        assert conn.execute("SELECT confirmed_flush_lsn >= pg_current_wal_insert_lsn() - 1000000 "
                            "FROM pg_replication_slots WHERE slot_name = %s", (config.source.slot,)).fetchone()


_near_misses = st.sampled_from(OWN_PREFIXES).map(lambda p: p + " ") | st.sampled_from(OWN_PREFIXES).map(str.upper)
_prefix = st.sampled_from(OWN_PREFIXES) | st.sampled_from(OWN_PREFIXES) | _near_misses | st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=30)
_field = st.none() | st.integers(-2**70, 2**70) | st.text(max_size=12) | st.sampled_from(
    ["bf_0123456789ab", "bf_\x00", "x" * 200, "1e400", "0123456789abcdef", "NaN"]) | st.lists(st.integers(), max_size=2)
_watermark = st.builds(
    lambda kind, fields, drop: json.dumps({"kind": kind, **{k: v for k, v in fields.items() if k not in drop}}),
    st.sampled_from(["low", "high", "mid", None]),
    st.fixed_dictionaries({"id": _field, "page": _field, "xid": _field, "token": _field, "mac": _field}),
    st.sets(st.sampled_from(["id", "page", "xid", "token", "mac"]))).map(str.encode)
_sized = st.builds(lambda chunk, size, wrap: (b'{"s": "' + (chunk * size)[:size] + b'"}') if wrap
                   else (chunk * size)[:size],
                   st.sampled_from([b"x", b"\xff", b"\xc3\xa9", b"\x00", b"[", b"{\"a\":"]),
                   st.sampled_from([0, 65520, 65536, 65537, 1_000_000, 3_000_000]), st.booleans())
_content = st.one_of(
    st.binary(max_size=64), st.binary(max_size=64).map(lambda b: b"\xff" + b), st.text(max_size=40).map(str.encode), _watermark, _sized,
    st.sampled_from([b'{"n": 1e-20000}', b'{"n": 1e131072}', b'{"n": 0.' + b"0" * 16384 + b"1}",
                     b'{"s": "\\u0000"}', b'{"s": "\\ud800"}', b"[" * 5000, b'{"a": NaN}', b"0123456789abcdef" * 2,
                     b'{"ok": true}']))
_message = st.tuples(_prefix, _content, st.booleans(), st.booleans())  # transactional, among changes


def test_fuzzed_logical_messages_never_stop_the_drain(source_db, db_factory, write_config, spark):
    config, dest = _pipeline(source_db, db_factory, write_config)
    drain = Drain(config)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            drain.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=run, name="drain", daemon=True)
    thread.start()
    ids = iter(range(1, 1_000_000))
    expected = {"a": 0, "b": 0}

    @settings(max_examples=50, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(messages=st.lists(_message, min_size=1, max_size=3))
    @example(messages=[(p, b"\xff\xfe", t, c) for p in OWN_PREFIXES for t, c in ((True, True), (False, False))])
    @example(messages=[(ANNOTATIONS, b'{"n": 1e-20000}', True, True)])
    def emit(messages: list[tuple[str, bytes, bool, bool]]) -> None:
        with source_db.connect() as conn:
            for prefix, content, transactional, among_changes in messages:
                if among_changes:
                    with conn.transaction():
                        conn.execute("INSERT INTO a VALUES (%s, 'x')", (next(ids),))
                        conn.execute(EMIT, (transactional, prefix, content))
                        conn.execute("INSERT INTO b VALUES (%s, 'y')", (next(ids),))
                else:
                    conn.execute(EMIT, (transactional, prefix, content))
                    conn.execute("INSERT INTO a VALUES (%s, 'z')", (next(ids),))
                expected["a"] += 1
                expected["b"] += among_changes
        wait_until(lambda: _logged(config) == {k: v for k, v in expected.items() if v} or errors
                   or not thread.is_alive(), what="every change of the example in the log")
        assert not errors and thread.is_alive(), errors
        assert drain.stats is not None and drain.stats.retries == 0, drain.stats

    try:
        emit()
    finally:
        drain.stop()
        thread.join(120)
    assert not errors, errors
    assert sum(drain.stats.skipped_messages.values()) > 0
    assert set(drain.stats.skipped_messages) <= set(OWN_PREFIXES)
    counted = {tuple(s.labels.values()): s.value for m in _own_counters([drain])
               if m.name == "cdc_logical_messages_skipped" for s in m.samples}
    assert counted == {(p,): float(drain.stats.skipped_messages.get(p, 0)) for p in OWN_PREFIXES}
    deliver(config, spark)
    for table in ("a", "b"):
        assert assert_mirrored(source_db.dsn, f"public.{table}", dest.dsn, f"mirror.{table}") == expected[table]
