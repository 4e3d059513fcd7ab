"""Property (issue 15): hostile identifiers for columns and routes (quotes, `%`, `$`, unicode, reserved words,
63-byte names) reach a real Postgres destination through the Postgres sink, which either delivers exactly or
parks the message with a clear reason, and never fails the run."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg import sql

from cdc_pipeline.config import PostgresDestination
from cdc_pipeline.delivery.schedule.dispatch import deliver_in_order
from cdc_pipeline.postgres.catalog import ColumnInfo, TableInfo
from cdc_pipeline.postgres.compose import execute
from cdc_pipeline.postgres.keyset import parse_qualified
from cdc_pipeline.sinks.base import OutboundMessage
from cdc_pipeline.sinks.postgres.client import PostgresSink

NASTY = ["%", "%s", "a%sb", "100%", "%%", '"', '""', "a'b", "'", "$1", "$$", "a$b", "select", "user", "order",
         "from", "table", "ÿ", "日本語", "🙂", "é" * 31, "x" * 63, "é" * 31 + "x", " ", "a b", "a.b", "\\", "{}",
         "{0}", "; drop table x--", "NULL", "\t", "Ω%s"]
_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
identifiers = st.one_of(st.sampled_from(NASTY), st.text(_chars, min_size=1, max_size=20)).filter(
    lambda s: len(s.encode()) <= 63)
routes = st.one_of(
    st.tuples(identifiers, identifiers).map(lambda p: ".".join(sql_quote(x) for x in p)),
    st.text(_chars, min_size=1, max_size=40),
    st.sampled_from(["a.b.c", "pg_temp.x", "pg_catalog.t", "information_schema.t", '"".x', "x.", ".x",
                     'out."unterminated', "public.ok"]),
)
_counter = itertools.count()


@pytest.fixture
def dest_dsn(db_factory) -> str:
    """One real destination database for all of a property's examples (each uses its own tables)."""
    return db_factory().dsn


def sql_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sink_for(dsn: str, mode: str) -> PostgresSink:
    dest = PostgresDestination(dsn=dsn, table="mirror.{table}" if mode == "mirror" else "out.fallback", mode=mode)
    sink = PostgresSink(SimpleNamespace(name=f"prop_{mode}", destination=dest))
    sink.open()
    return sink


def message(n: int, table: str, action: str, record: dict[str, object], route: str | None = None,
            changes: dict[str, object] | None = None) -> OutboundMessage:
    payload = {"record": record, "changes": changes, "action": action,
               "metadata": {"table_schema": "public", "table_name": table, "commit_lsn": 1000 + n,
                            "commit_idx": 0, "idempotency_key": f"{1000 + n}:0"}}
    return OutboundMessage(key=f"{1000 + n}:0", group=None, route=route,
                           payload=json.dumps(payload, ensure_ascii=False).encode())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(columns=st.lists(identifiers, min_size=1, max_size=4, unique=True))
def test_hostile_column_names_are_mirrored_exactly(dest_dsn, columns) -> None:
    dsn = dest_dsn
    table = f"t{next(_counter)}"
    info = TableInfo("public", table, tuple(
        ColumnInfo(c, "integer" if i == 0 else "text", 23 if i == 0 else 25, i > 0, i == 0)
        for i, c in enumerate(columns)), (columns[0],), "d", (columns[0],))
    sink = sink_for(dsn, "mirror")
    sink.context.describe = lambda name: info if name == f"public.{table}" else None
    rows = {k: {c: (k if i == 0 else f"{c}%s'{k}") for i, c in enumerate(columns)} for k in range(1, 4)}
    batch = [message(k, table, "insert", r) for k, r in rows.items()]
    rows[2] = {**rows[2], **{c: "changed %" for c in columns[1:]}}
    batch.append(message(10, table, "update", rows[2]))
    batch.append(message(11, table, "delete", {columns[0]: 3}))
    del rows[3]
    try:
        assert sink.deliver(batch) == [None] * len(batch)
    finally:
        sink.close()
    with psycopg.connect(dsn) as conn:
        got = conn.execute(sql.SQL("SELECT to_jsonb(r.*) FROM {} r").format(
            sql.Identifier("mirror", table))).fetchall()
    assert sorted((r[0] for r in got), key=lambda r: r[columns[0]]) == [rows[k] for k in sorted(rows)]


def must_park(route: str) -> str | None:
    """The rule, stated independently of the sink: what a route's message must be parked for (None: it must
    be delivered). Not `schema.table`, a name over 63 bytes, or a system schema (pg_temp would "deliver" into
    a table that vanishes with the session)."""
    try:
        schema, name = parse_qualified(route)
    except ValueError:
        return "schema.table"
    if any(len(part.encode()) > 63 for part in (schema, name)):
        return "bytes"
    if schema.startswith("pg_") or schema == "information_schema":
        return "system schema"
    return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=routes)
@example(route="pg_temp.x").via("system schema, creatable")
@example(route="pg_catalog.t").via("system schema")
@example(route="information_schema.t").via("system schema")
@example(route="public.ok").via("delivered")
def test_hostile_routes_deliver_exactly_or_park(dest_dsn, route) -> None:
    dsn = dest_dsn
    n = next(_counter)
    sink = sink_for(dsn, "append")
    sink.context.describe = lambda name: None
    batch = [message(n, "t", "insert", {"id": n}, route=route), message(n + 100000, "t", "insert", {"id": n})]
    try:
        results = deliver_in_order(sink, batch)  # never raises: a bad route is that message's failure
    finally:
        sink.close()
    assert results[1] is None  # its neighbour (default table) is delivered either way
    reason = must_park(route)
    if reason is not None:  # parked, for the rule's reason (not some error the destination happened to raise)
        assert isinstance(results[0], str) and reason in results[0] and "\x00" not in results[0], results[0]
        return
    assert results[0] is None, results[0]
    schema, name = parse_qualified(route)
    with psycopg.connect(dsn) as conn:
        found = execute(conn, sql.SQL("SELECT message->'record' FROM {} WHERE idempotency_key = %s").format(
            sql.Identifier(schema, name)), (f"{1000 + n}:0",)).fetchall()
    assert found == [({"id": n},)]


@settings(max_examples=40, deadline=None)
@given(route=st.text(_chars, min_size=1, max_size=40))
def test_hostile_routes_on_a_redis_stream_deliver_exactly_or_park(route) -> None:
    """The same property on a real Redis: a route is a stream key, any text is one."""
    import redis

    from cdc_pipeline.config import RedisStreamDestination
    from cdc_pipeline.sinks import build_sink
    from cdc_pipeline_tests.integration.sinks.test_sinks_brokers import REDIS_URL, sink_config

    key = f"cdc:prop:{next(_counter)}:{route}"
    batch = [message(1, "t", "insert", {"id": 1}, route=key)]
    client = redis.Redis.from_url(REDIS_URL)
    try:
        with build_sink(sink_config(RedisStreamDestination(url=REDIS_URL, stream_key="cdc:prop:default"))) as sink:
            results = sink.deliver(batch)
        assert results == [None], results  # any text is a stream key: nothing to park
        entries = client.xrange(key.encode())
        assert [(f[b"key"].decode(), f[b"data"]) for _, f in entries] == [(batch[0].key, batch[0].payload)]
    finally:
        client.delete(key.encode(), "cdc:prop:default")
        client.close()
