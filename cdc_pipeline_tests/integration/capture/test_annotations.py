"""Transaction annotations: pg_logical_emit_message(true, 'cdc_pipeline:annotations', <json object>) inside a
transaction puts the object into metadata.annotations of its changes logged after it, on both stages."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest
from cdc_pipeline.capture import annotations
from cdc_pipeline.delivery.arrow_stage import run_arrow_stage
from cdc_pipeline.delivery.plan import SinkPlan
from cdc_pipeline.delivery.spark_stage import run_stage
from cdc_pipeline.state.change_log import ChangeLog
from cdc_pipeline_tests.helpers import drain, mirror_config
from cdc_pipeline_tests.integration.backfill.test_backfill import drain_running

EMIT = "SELECT pg_logical_emit_message(true, 'cdc_pipeline:annotations', %s)"


def _messages(config, spark) -> list[dict]:  # type: ignore[no-untyped-def]
    with psycopg.connect(config.state_dsn) as conn:
        batch = ChangeLog("cdc_pipeline").load_batch(conn, ["public.t"], (0, -1), 1000)
    plan = SinkPlan.build(config, config.sink("mirror"))
    via_arrow = run_arrow_stage(plan, batch).column("payload").to_pylist()
    via_spark = run_stage(spark, plan, batch, {}).column("payload").to_pylist()
    assert via_arrow == via_spark  # byte for byte, annotated or not
    return [json.loads(p) for p in via_arrow]


@pytest.mark.pg_matrix
def test_annotated_transactions_carry_their_object_and_bad_ones_are_ignored(
        source_db, db_factory, write_config, spark, caplog):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"]))
    setup(config)
    note = {"user": "ada", "why": "refund é\"\\", "request": 42, "n": 1.50, "tags": ["a", None]}
    with source_db.connect() as conn:
        conn.execute("INSERT INTO t VALUES (1, 'before')")  # plain transaction: no annotation
        with conn.transaction():
            conn.execute("INSERT INTO t VALUES (2, 'early')")  # before the message: none
            conn.execute(EMIT, (json.dumps(note),))
            conn.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(3, 5) g")
            conn.execute("UPDATE t SET v = 'y' WHERE id = 3")
            conn.execute("DELETE FROM t WHERE id = 4")
        with conn.transaction():  # malformed ones: logged, ignored, the drain goes on
            for bad in ('{"unterminated": ', '[1, 2]', '{"nan": NaN}', '{"nul": "a\\u0000b"}', '{"s": "\\ud800"}'):
                conn.execute(EMIT, (bad,))
            conn.execute("INSERT INTO t VALUES (6, 'bad notes')")
        conn.execute("SELECT pg_logical_emit_message(true, 'cdc_pipeline:annotations', %s::bytea)",
                     (b"\xff\xfe",))  # not UTF-8, outside a transaction block of ours: its own transaction
        with conn.transaction():  # a later annotation replaces the earlier one for changes after it
            conn.execute(EMIT, ('{"step": 1}',))
            conn.execute("INSERT INTO t VALUES (7, 'one')")
            conn.execute(EMIT, ('{"step": 2}',))
            conn.execute(EMIT, ("not json",))  # refused: the one in force stays
            conn.execute("INSERT INTO t VALUES (8, 'two')")
        conn.execute("INSERT INTO t VALUES (9, 'after')")
    with caplog.at_level(logging.WARNING, logger="cdc_pipeline.capture.drain"):
        stats = drain(config)
    assert stats.changes == 11
    refused = [r.getMessage() for r in caplog.records if "ignored the annotation" in r.getMessage()]
    assert len(refused) == 7, refused
    assert not any("unterminated" in m or "ud800" in m for m in refused)  # never the content itself
    by_id = {(m["record"]["id"], m["action"]): m["metadata"] for m in _messages(config, spark)}
    assert len(by_id) == 11
    carried = {k: meta.get("annotations") for k, meta in by_id.items()}
    assert carried == {
        (1, "insert"): None, (2, "insert"): None,
        (3, "insert"): note, (4, "insert"): note, (5, "insert"): note, (3, "update"): note, (4, "delete"): note,
        (6, "insert"): None, (7, "insert"): {"step": 1}, (8, "insert"): {"step": 2}, (9, "insert"): None,
    }
    assert sum(1 for meta in by_id.values() if "annotations" not in meta) == 4  # no key where none


def test_backfill_reads_carry_no_annotation(source_db, db_factory, write_config, spark):
    dest = db_factory()
    source_db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    source_db.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 20) g")
    config = write_config(mirror_config(source_db.dsn, dest.dsn, ["public.t"]))
    setup(config)
    with source_db.connect() as conn, conn.transaction():
        conn.execute(EMIT, ('{"who": "ops"}',))
        conn.execute("UPDATE t SET v = 'y' WHERE id = 1")
    with drain_running(config):  # the backfill's watermarks are reconciled by a running drain
        Backfiller(config, BackfillRequest("public.t")).run()
    drain(config)
    messages = _messages(config, spark)
    reads = [m for m in messages if m["action"] == "read"]
    assert len(reads) == 20 and all("annotations" not in m["metadata"] for m in reads)
    assert [m["metadata"]["annotations"] for m in messages if m["action"] == "update"] == [{"who": "ops"}]


# Number literals around numeric's bounds: digits after the point (16383), magnitude (base-10000 weight
# 32767), the exponent's own bound (INT_MAX / 2) and exponents written with many digits.
_BOUNDS = [0, 1, 3, 4, 5, 16382, 16383, 16384, 131068, 131071, 131072, 131075, 1073741822, 1073741823, 2**63]
_exponent = st.one_of(
    st.none(), st.integers(-140_000, 140_000).map(str),
    st.builds(lambda b, d, neg: str(-(b + d) if neg else b + d), st.sampled_from(_BOUNDS), st.integers(-2, 2),
              st.booleans()),
    st.builds(lambda zeros, n: "0" * zeros + str(n), st.integers(0, 30), st.integers(0, 20)),
    st.from_regex(r"[+-]?[0-9]{1,40}", fullmatch=True))
_digits = st.one_of(st.from_regex(r"[0-9]{1,12}", fullmatch=True),
                    st.builds(lambda zeros, n, tail: "0" * (n + zeros) + tail, st.sampled_from(_BOUNDS[:8]),
                              st.integers(-2, 2), st.sampled_from(["", "1", "10", "5000"])))
_number = st.builds(
    lambda neg, whole, frac, e_char, exp: ("-" if neg else "") + whole + (f".{frac}" if frac else "")
    + (f"{e_char}{exp}" if exp is not None else ""),
    st.booleans(), st.one_of(st.just("0"), st.from_regex(r"[1-9][0-9]{0,8}", fullmatch=True), _digits),
    st.one_of(st.none(), _digits), st.sampled_from("eE"), _exponent)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
_content = st.one_of(
    _number.map(lambda n: f'{{"n": {n}}}'.encode()),
    st.builds(lambda v, ascii_: json.dumps(v, ensure_ascii=ascii_).encode("utf-8", "surrogatepass"), _json,
              st.booleans()),
    st.builds(lambda key, text: b'{"' + key + b'": "' + text + b'"}',
              st.sampled_from([b"k", b"\\u0000", b"\\ud800", b"\\udc00x", b"\\ud83d\\ude00"]),
              st.from_regex(rb"([a-z \t]|\\u[0-9a-fA-F]{4}|\\[nrtbf/\"\\]|\\x|\xc3\xa9|\xff|\x00|\n){0,6}",
                            fullmatch=True)),
    st.binary(max_size=40),
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")))


@pytest.fixture(scope="module")
def jsonb_input(pg_admin_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        assert conn.execute("SHOW server_encoding").fetchone() == ("UTF8",)
        yield conn


def _stored_by_jsonb(conn: psycopg.Connection, content: bytes) -> bool:
    """Whether PostgreSQL's own input takes these bytes as a jsonb object (the COPY into the change log's
    column runs the same jsonb input on the same UTF-8 text)."""
    try:
        row = conn.execute("SELECT jsonb_typeof(convert_from(%s::bytea, 'UTF8')::jsonb) = 'object'",
                           (content,)).fetchone()
    except psycopg.DataError:
        return False
    return bool(row and row[0])


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=_content)
def test_parse_accepts_only_what_jsonb_stores(jsonb_input, content):
    """The annotation parser against PostgreSQL's own jsonb input: it accepts exactly what jsonb stores (up to
    the documented size bound, above which it refuses whatever jsonb would do)."""
    text, refused = annotations.parse(content)
    assert (text is None) != (refused is None)
    if len(content) > annotations.MAX_BYTES:
        assert text is None
    else:
        assert (text is not None) == _stored_by_jsonb(jsonb_input, content), (content[:200], refused)


def test_parse_refuses_at_the_bounds_and_never_quotes_the_content():
    for content, ok in [(b'{"n": 1e-20000}', False), (b'{"n": 0e-16384}', False), (b'{"n": 1e-16383}', True),
                        (b'{"n": 1e131071}', True), (b'{"n": 1e131072}', False), (b'{"n": 1e1073741823}', False),
                        (b'{"s": "' + b"x" * annotations.MAX_BYTES + b'"}', False), (b"[" * 100000, False)]:
        text, refused = annotations.parse(content)
        assert (text is not None) is ok, (content[:40], refused)
        assert refused is None or "1e" not in refused and "xxx" not in refused
    assert annotations.parse(b'{"caf\u00e9": "\u00e9t\u00e9"}', ascii_only=True)[0] is None
    assert annotations.parse(b'{"plain": "ascii"}', ascii_only=True)[0] is not None
