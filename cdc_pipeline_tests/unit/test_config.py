"""Unit tests for cdc_pipeline.config: parsing, defaults, interpolation, error messages, redaction."""

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cdc_pipeline.config import (
    BackfillConfig,
    BackoffConfig,
    ConfigError,
    DeliveryConfig,
    DrainConfig,
    NatsDestination,
    ParquetDestination,
    PipelineConfig,
    PostgresDestination,
    RabbitMQDestination,
    RedisStreamDestination,
    SourceConfig,
    SparkConfig,
    StateConfig,
    TableConfig,
    WebhookDestination,
    load_config,
    parse_config,
    redact,
)

# The design's config example, with real DSNs in place of `...`.
DESIGN_EXAMPLE = """\
source:   {dsn: "${SOURCE_DSN}", slot: cdc_pipeline, publication: cdc_pipeline}
state:    {dsn: "${STATE_DSN}"}   # internal store; defaults to the source database, own schema
spark:    {master: "local[*]", conf: {}}
tables:
  - name: public.orders
    sort_column: updated_at       # optional: partial backfills and partitions
    group_columns: [account_id]   # optional: message grouping, default the primary key
sinks:
  - name: orders_mirror
    tables: [public.orders]
    actions: [insert, update, delete]
    filter: "record.status <> 'draft'"          # optional Spark SQL
    transform: null                              # optional
    message_grouping: true
    max_retries: null                            # null = retry forever
    destination: {type: postgres, dsn: "${SINK_DSN}", table: analytics.orders, mode: mirror}
"""
DESIGN_ENV = {
    "SOURCE_DSN": "postgresql://cdc:s3cret@db.example:5432/shop",
    "STATE_DSN": "postgresql://cdc:s3cret@db.example:5432/cdc_state",
    "SINK_DSN": "postgresql://writer:hunter2@warehouse:5432/analytics",
}

MINIMAL = """\
source: {dsn: "postgresql://localhost/shop"}
tables: [{name: orders}]
"""


def config_error(text: str, environ: dict[str, str] | None = None, source: str = "cdc.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source, environ if environ is not None else {})
    return str(info.value)


def with_sink(destination: str, extra: str = "") -> str:
    """MINIMAL plus one sink on public.orders with the given flow-style destination."""
    return MINIMAL + f"sinks:\n  - name: s1\n    tables: [orders]\n{extra}    destination: {destination}\n"


# --------------------------------------------------------------------------------------------------
# Valid configs and defaults
# --------------------------------------------------------------------------------------------------


def test_design_example_parses() -> None:
    cfg = parse_config(DESIGN_EXAMPLE, "cdc.yaml", DESIGN_ENV)
    assert cfg.source == SourceConfig(
        dsn=DESIGN_ENV["SOURCE_DSN"], slot="cdc_pipeline", publication="cdc_pipeline"
    )
    assert cfg.state.dsn == DESIGN_ENV["STATE_DSN"]
    assert cfg.state_dsn == DESIGN_ENV["STATE_DSN"]
    assert cfg.spark == SparkConfig(master="local[*]", conf={})
    (table,) = cfg.tables
    assert (table.name, table.schema_name, table.table_name, table.qualified) == (
        "public.orders",
        "public",
        "orders",
        "public.orders",
    )
    assert table.sort_column == "updated_at"
    assert table.group_columns == ["account_id"]
    assert table.partitions is None
    sink = cfg.sink("orders_mirror")
    assert sink.tables == ["public.orders"]
    assert sink.actions == ["insert", "update", "delete"]
    assert sink.filter == "record.status <> 'draft'"
    assert sink.transform is None
    assert sink.message_grouping is True
    assert sink.max_retries is None
    assert sink.destination == PostgresDestination(
        type="postgres", dsn=DESIGN_ENV["SINK_DSN"], table="analytics.orders", mode="mirror"
    )
    assert cfg.path is None  # parsed from a string


def test_defaults() -> None:
    cfg = parse_config(MINIMAL, "cdc.yaml", {})
    assert cfg.source.slot == "cdc_pipeline"
    assert cfg.source.publication == "cdc_pipeline"
    assert cfg.state == StateConfig(dsn=None, schema_name="cdc_pipeline", retention_hours=None)
    assert cfg.state_dsn == "postgresql://localhost/shop"  # defaults to the source database
    assert cfg.spark == SparkConfig(master="local[*]", conf={})
    assert cfg.drain == DrainConfig(
        tick_seconds=20, heartbeat_seconds=5, batch_rows=20000, batch_ms=200, idle_seconds=2
    )
    assert cfg.delivery == DeliveryConfig(batch_size=20000, idle_seconds=0.25, lag_trigger_messages=1)
    assert cfg.backfill == BackfillConfig(
        max_query_ms=5000,
        max_page_size=50000,
        initial_page_size=1000,
        max_staged_pages=4,
        max_sink_backlog=500000,
    )
    assert cfg.sinks == []
    assert cfg.tables == [TableConfig(name="public.orders")]


def test_sink_defaults() -> None:
    sink = parse_config(with_sink("{type: parquet, path: /tmp/out}"), "cdc.yaml", {}).sink("s1")
    assert sink.actions == ["insert", "update", "delete"]
    assert (sink.filter, sink.transform, sink.route, sink.max_retries, sink.batch_size) == (None,) * 5
    assert sink.message_grouping is True
    assert sink.backoff == BackoffConfig(initial_ms=1000, max_ms=300000, multiplier=2.0, jitter=0.2)
    assert sink.destination == ParquetDestination(type="parquet", path="/tmp/out")


@pytest.mark.parametrize(
    ("destination", "expected"),
    [
        (
            "{type: postgres, dsn: 'postgresql://h/db', table: t}",
            PostgresDestination(dsn="postgresql://h/db", table="public.t"),
        ),
        (
            "{type: webhook, url: 'https://hooks.example/cdc'}",
            WebhookDestination(
                url="https://hooks.example/cdc",
                headers={},
                timeout_ms=10000,
                hmac_secret_env=None,
                signature_header="X-CDC-Signature",
            ),
        ),
        (
            "{type: redis_stream}",
            RedisStreamDestination(url="redis://127.0.0.1:6379/0", stream_key="cdc", maxlen=None),
        ),
        (
            "{type: nats}",
            NatsDestination(url="nats://127.0.0.1:4222", subject="cdc", stream="CDC", ack_timeout_ms=5000),
        ),
        (
            "{type: rabbitmq}",
            RabbitMQDestination(
                url="amqp://guest:guest@127.0.0.1:5672/%2F",
                exchange="cdc",
                exchange_type="topic",
                routing_key="cdc",
            ),
        ),
        ("{type: parquet, path: out/orders}", ParquetDestination(path="out/orders")),
    ],
)
def test_every_destination_type_with_defaults(destination: str, expected: object) -> None:
    cfg = parse_config(with_sink(destination), "cdc.yaml", {})
    assert cfg.sink("s1").destination == expected


def test_webhook_full() -> None:
    text = with_sink(
        "{type: webhook, url: 'http://127.0.0.1:8080/in', headers: {X-Api-Version: 2, X-Flag: true}, "
        "timeout_ms: 500, hmac_secret_env: WEBHOOK_SECRET, signature_header: X-Sig, batch_size: 10}"
    )
    with pytest.warns(FutureWarning, match=r"sinks\[0\]\.destination\.batch_size is deprecated"):
        sink = parse_config(text, "cdc.yaml", {}).sink("s1")
    dest = sink.destination
    assert sink.batch_size == 10  # the deprecated alias is the sink's batch_size
    assert isinstance(dest, WebhookDestination)
    assert dest.headers == {"X-Api-Version": "2", "X-Flag": "true"}
    assert (dest.timeout_ms, dest.hmac_secret_env, dest.signature_header, dest.batch_size) == (
        500,
        "WEBHOOK_SECRET",
        "X-Sig",
        10,
    )


def test_batch_size_and_max_in_flight_once_per_sink_with_the_destinations_as_aliases() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the sink's own keys: no warning
        sink = parse_config(with_sink("{type: webhook, url: 'http://h/in'}", "    batch_size: 5\n    max_in_flight: 7\n"),
                            "c.yaml", {}).sink("s1")
    assert (sink.batch_size, sink.max_in_flight) == (5, 7)
    with pytest.warns(FutureWarning) as caught:
        sink = parse_config(with_sink("{type: sqs, queue_url: 'http://h/1/q.fifo', max_in_flight: 3}", "    batch_size: 4\n"),
                            "c.yaml", {}).sink("s1")
    assert [str(w.message) for w in caught] == [
        "c.yaml: sinks[0].destination.max_in_flight is deprecated: it is the sink's max_in_flight "
        "(sinks[0].max_in_flight); move it up"]
    assert (sink.batch_size, sink.max_in_flight) == (4, 3)
    with pytest.warns(FutureWarning):  # both set: the destination's (the older key's meaning) is used
        sink = parse_config(with_sink("{type: typesense, endpoint_url: 'http://h:8108', api_key: k, batch_size: 50}",
                                      "    batch_size: 9\n"), "c.yaml", {}).sink("s1")
    assert sink.batch_size == 50
    error = config_error(with_sink("{type: postgres, dsn: 'postgresql://h/d', table: t}", "    max_in_flight: 4\n"))
    assert "sinks[0].max_in_flight: a postgres sink takes one call at a time (got 4): remove the key" in error


def test_spark_conf_values_coerced_to_strings() -> None:
    text = MINIMAL + "spark:\n  conf: {spark.sql.shuffle.partitions: 4, spark.ui.enabled: false, f: 0.5}\n"
    conf = parse_config(text, "cdc.yaml", {}).spark.conf
    # Lower-case booleans: Spark would not understand "False".
    assert conf == {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false", "f": "0.5"}


def test_state_schema_key_and_alias() -> None:
    cfg = parse_config(
        MINIMAL + "state: {dsn: 'postgresql://h/state', schema: cdc_meta, retention_hours: 48}\n", "c", {}
    )
    assert cfg.state.schema_name == "cdc_meta"
    assert cfg.state.retention_hours == 48
    assert cfg.state_dsn == "postgresql://h/state"
    assert StateConfig(schema_name="a").schema_name == "a"  # populate_by_name
    assert StateConfig(schema="b").schema_name == "b"  # type: ignore[call-arg]


def test_bare_table_names_mean_public() -> None:
    text = """\
source: {dsn: x}
tables: [{name: orders}, {name: sales.invoices}]
sinks: [{name: a, tables: [orders, sales.invoices], destination: {type: parquet, path: p}}]
"""
    cfg = parse_config(text, "cdc.yaml", {})
    assert [t.qualified for t in cfg.tables] == ["public.orders", "sales.invoices"]
    assert cfg.tables[0].name == "public.orders"  # normalized, so names compare equal
    assert cfg.sink("a").tables == ["public.orders", "sales.invoices"]
    assert cfg.table("orders") is cfg.table("public.orders") is cfg.tables[0]
    assert cfg.table("sales.invoices").schema_name == "sales"


def test_same_table_twice_in_a_sink() -> None:
    text = with_sink("{type: parquet, path: p}").replace(
        "tables: [orders]", "tables: [orders, public.orders]"
    )
    assert config_error(text) == "cdc.yaml: sinks[0].tables[1]: table 'public.orders' is listed twice"


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_lake_sink_takes_no_route(kind: str) -> None:
    where = "path: /lake" if kind == "delta" else "warehouse: file:///lake"
    text = with_sink(f"{{type: {kind}, {where}}}", extra="    route: \"'elsewhere'\"\n")
    assert config_error(text) == (f"cdc.yaml: sinks[0].route: a {kind} sink writes each source table to its own "
                                  "lake table (destination.table's pattern) and takes no route: remove the key")
    parse_config(with_sink("{type: parquet, path: p}", extra="    route: \"'elsewhere'\"\n"), "cdc.yaml", {})


def test_postgres_destination_table_is_qualified() -> None:
    dest = (
        parse_config(with_sink("{type: postgres, dsn: d, table: mirror_orders, mode: append}"), "c", {})
        .sink("s1")
        .destination
    )
    assert isinstance(dest, PostgresDestination)
    assert (dest.table, dest.mode) == ("public.mirror_orders", "append")


def test_table_and_sink_lookup_errors_list_known_names() -> None:
    cfg = parse_config(with_sink("{type: parquet, path: p}"), "cdc.yaml", {})
    with pytest.raises(ConfigError, match=r"unknown table 'invoices' \(configured tables: public.orders\)"):
        cfg.table("invoices")
    with pytest.raises(ConfigError, match=r"unknown sink 'nope' \(configured sinks: s1\)"):
        cfg.sink("nope")


def test_transform_forms() -> None:
    cfg = parse_config(
        with_sink("{type: parquet, path: p}", "    transform: my_pkg.transforms:enrich\n"), "c", {}
    )
    assert cfg.sink("s1").transform == "my_pkg.transforms:enrich"
    text = with_sink(
        "{type: parquet, path: p}",
        "    transform: {id: record.id, total: 'record.qty * record.price', one: 1}\n",
    )
    assert parse_config(text, "c", {}).sink("s1").transform == {
        "id": "record.id",
        "total": "record.qty * record.price",
        "one": "1",
    }
    message = config_error(with_sink("{type: parquet, path: p}", "    transform: 'not a callable'\n"))
    assert "cdc.yaml: sinks[0].transform: must look like 'package.module:function'" in message


def test_partitions() -> None:
    text = """\
source: {dsn: x}
tables:
  - {name: orders, sort_column: updated_at, partitions: {start: 2024-01-01}}
  - {name: events, sort_column: id, partitions: {kind: integer, start: 0, end: 1000000, step: 10000}}
  - {name: logs, sort_column: ts, partitions: {kind: hourly, start: '2024-01-01T00:00:00+00:00', end: 2024-02-01 00:00:00+00:00}}
"""
    orders, events, logs = parse_config(text, "c", {}).tables
    assert orders.partitions is not None and events.partitions is not None and logs.partitions is not None
    assert (orders.partitions.kind, orders.partitions.start, orders.partitions.end) == (
        "daily",
        "2024-01-01",
        None,
    )
    assert (
        events.partitions.kind,
        events.partitions.start,
        events.partitions.end,
        events.partitions.step,
    ) == (
        "integer",
        "0",
        "1000000",
        10000,
    )
    assert logs.partitions.kind == "hourly"


def test_models_are_frozen() -> None:
    cfg = parse_config(MINIMAL, "c", {})
    with pytest.raises(ValidationError):
        cfg.source.slot = "other"  # type: ignore[misc]


def test_path_is_not_a_config_key() -> None:
    assert "cdc.yaml: unknown key 'path'" in config_error(MINIMAL + "path: /elsewhere\n")


def test_deprecated_keys_load_with_a_warning_that_they_have_no_effect() -> None:
    import warnings

    with pytest.warns(FutureWarning) as caught:
        cfg = parse_config(MINIMAL + "drain: {idle_seconds: 1, tick_seconds: 3}\ndelivery: {lag_trigger_messages: 5}\n",
                           "c.yaml", {})
    assert [str(w.message) for w in caught] == [
        "c.yaml: drain.tick_seconds is deprecated and has no effect; remove it",
        "c.yaml: drain.idle_seconds is deprecated and has no effect; remove it",
        "c.yaml: delivery.lag_trigger_messages is deprecated and has no effect; remove it",
    ]
    assert cfg.drain.idle_seconds == 1 and cfg.delivery.lag_trigger_messages == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not given: no warning
        parse_config(MINIMAL, "c.yaml", {})


# --------------------------------------------------------------------------------------------------
# Loading from files
# --------------------------------------------------------------------------------------------------


def test_load_config_from_path_and_env(tmp_path: Path) -> None:
    file = tmp_path / "cdc.yaml"
    file.write_text(DESIGN_EXAMPLE)
    cfg = load_config(file, environ=DESIGN_ENV)
    assert cfg.path == str(file)
    assert cfg.sink("orders_mirror").destination.type == "postgres"
    from_env = load_config(environ={**DESIGN_ENV, "CDC_CONFIG": str(file)})
    assert from_env == cfg and from_env.path == str(file)


def test_load_config_defaults_to_process_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "cdc.yaml"
    file.write_text(MINIMAL.replace("postgresql://localhost/shop", "${MY_DSN}"))
    monkeypatch.setenv("CDC_CONFIG", str(file))
    monkeypatch.setenv("MY_DSN", "postgresql://envhost/db")
    assert load_config().source.dsn == "postgresql://envhost/db"


def test_load_config_without_path_or_env() -> None:
    with pytest.raises(ConfigError, match="CDC_CONFIG"):
        load_config(environ={})


def test_file_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing, environ={})
    assert str(info.value) == f"{missing}: file not found"


def test_directory_is_not_a_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path}: is a directory")):
        load_config(tmp_path, environ={})


def test_errors_name_the_loaded_file(tmp_path: Path) -> None:
    file = tmp_path / "cdc.yaml"
    file.write_text(MINIMAL + "bogus: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(file), environ={})
    assert str(info.value).startswith(f"{file}: unknown key 'bogus'")


# --------------------------------------------------------------------------------------------------
# Interpolation
# --------------------------------------------------------------------------------------------------


def test_interpolation_set_variable() -> None:
    cfg = parse_config(DESIGN_EXAMPLE, "cdc.yaml", DESIGN_ENV)
    assert cfg.source.dsn == DESIGN_ENV["SOURCE_DSN"]


def test_interpolation_default_used_when_unset_or_empty() -> None:
    text = "source: {dsn: '${DSN:-postgresql://fallback/db}'}\ntables: [{name: t}]\n"
    assert parse_config(text, "c", {}).source.dsn == "postgresql://fallback/db"
    assert parse_config(text, "c", {"DSN": ""}).source.dsn == "postgresql://fallback/db"
    assert parse_config(text, "c", {"DSN": "postgresql://set/db"}).source.dsn == "postgresql://set/db"


def test_interpolation_inside_text_and_typed_values() -> None:
    text = """\
source: {dsn: "host=${PGHOST} dbname=${PGDB:-shop}"}
drain: {batch_rows: "${ROWS:-100}"}
sinks: [{name: s, tables: [t], message_grouping: "${GROUPING}", destination: {type: parquet, path: p}}]
tables: [{name: t}]
"""
    cfg = parse_config(text, "c", {"PGHOST": "db1", "GROUPING": "false"})
    assert cfg.source.dsn == "host=db1 dbname=shop"
    assert cfg.drain.batch_rows == 100  # a string from the environment still validates as an int
    assert cfg.sink("s").message_grouping is False


def test_interpolation_nested_in_lists() -> None:
    text = """\
source: {dsn: x}
tables: [{name: orders, group_columns: ["${GROUP_COL}", b]}, {name: "${SECOND}"}]
sinks: [{name: s, tables: [orders, "${SECOND}"], destination: {type: parquet, path: p}}]
"""
    cfg = parse_config(text, "c", {"GROUP_COL": "account_id", "SECOND": "sales.invoices"})
    assert cfg.tables[0].group_columns == ["account_id", "b"]
    assert cfg.sink("s").tables == ["public.orders", "sales.invoices"]


def test_interpolation_missing_variable_names_variable_and_path() -> None:
    message = config_error(DESIGN_EXAMPLE, {"STATE_DSN": "x", "SINK_DSN": "y"})
    assert message == "cdc.yaml: source.dsn: environment variable SOURCE_DSN is not set"


def test_interpolation_missing_variables_in_lists_one_line_each() -> None:
    text = "source: {dsn: x}\ntables: [{name: t, group_columns: [a, '${C1}', '${C2}']}]\n"
    assert config_error(text).splitlines() == [
        "cdc.yaml: tables[0].group_columns[1]: environment variable C1 is not set",
        "cdc.yaml: tables[0].group_columns[2]: environment variable C2 is not set",
    ]


def test_interpolation_escape() -> None:
    text = (
        "source: {dsn: x}\ntables: [{name: t}]\nspark: {conf: {a: '$${HOME}', b: 'cost: $$5 and $${X:-y}'}}\n"
    )
    conf = parse_config(text, "c", {"HOME": "/root"}).spark.conf
    assert conf == {"a": "${HOME}", "b": "cost: $$5 and ${X:-y}"}


def test_interpolation_values_are_not_parsed_as_yaml_or_reexpanded() -> None:
    tricky = "a: b # not a comment\n- [x, {y: z}] ${OTHER} &anchor *alias 'q\" | >"
    text = "source: {dsn: '${DSN}'}\ntables: [{name: t}]\n"
    assert parse_config(text, "c", {"DSN": tricky, "OTHER": "boom"}).source.dsn == tricky


def test_interpolation_invalid_reference() -> None:
    message = config_error("source: {dsn: '${1BAD}'}\ntables: [{name: t}]\n")
    assert message.startswith("cdc.yaml: source.dsn: invalid variable reference")
    assert "$${" in message  # tells the user how to write a literal


def test_interpolation_does_not_touch_keys() -> None:
    text = "source: {dsn: x}\ntables: [{name: t}]\nspark: {conf: {'${K}': v}}\n"
    assert parse_config(text, "c", {"K": "k"}).spark.conf == {"${K}": "v"}


_YAML_NASTY = st.text(
    alphabet=st.one_of(st.sampled_from(list(":#{}[],&*!|>'\"%@`-?$\\ \t\n~=")), st.characters(codec="utf-8")),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(
    name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,30}", fullmatch=True),
    value=_YAML_NASTY,
    prefix=_YAML_NASTY.filter(lambda s: "$" not in s),
    default=_YAML_NASTY.filter(lambda s: "$" not in s and "}" not in s),
)
def test_interpolation_round_trips_any_value(name: str, value: str, prefix: str, default: str) -> None:
    text = (
        "source: {dsn: x}\n"
        "tables: [{name: t}]\n"
        "spark:\n"
        "  conf:\n"
        f"    plain: ${{{name}}}\n"
        f'    double: "${{{name}}}"\n'
        f"    prefixed: {_yaml_quote(prefix + '${' + name + '}' + prefix)}\n"
        f"    defaulted: {_yaml_quote('${' + name + '_UNSET:-' + default + '}')}\n"
    )
    conf = parse_config(text, "c", {name: value}).spark.conf
    assert conf["plain"] == value
    assert conf["double"] == value
    assert conf["prefixed"] == prefix + value + prefix
    assert conf["defaulted"] == default


def _yaml_quote(text: str) -> str:
    """A YAML double-quoted scalar for any text (escapes are unambiguous, unlike folding rules)."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        else:
            out.append(f"\\U{ord(c):08x}")
    return '"' + "".join(out) + '"'


# --------------------------------------------------------------------------------------------------
# Error messages
# --------------------------------------------------------------------------------------------------


def test_literal_error_lists_choices() -> None:
    message = config_error(DESIGN_EXAMPLE.replace("mode: mirror", "mode: upsert"), DESIGN_ENV)
    assert message == "cdc.yaml: sinks[0].destination.mode: must be one of 'mirror', 'append' (got 'upsert')"


def test_unknown_key_in_list_item() -> None:
    text = "source: {dsn: x}\ntables:\n  - name: a\n  - name: b\n    sortcolumn: id\n"
    assert config_error(text) == "cdc.yaml: tables[1]: unknown key 'sortcolumn' (did you mean 'sort_column'?)"


def test_unknown_key_lists_allowed_keys_when_nothing_is_close() -> None:
    message = config_error(MINIMAL + "spark: {zzz: 1}\n")
    assert message == "cdc.yaml: spark: unknown key 'zzz' (allowed: master, conf)"


def test_unknown_top_level_key() -> None:
    assert config_error(MINIMAL + "sinkz: []\n") == "cdc.yaml: unknown key 'sinkz' (did you mean 'sinks'?)"


def test_missing_required_keys() -> None:
    assert config_error("tables: [{name: t}]\n") == "cdc.yaml: source: required key is missing"
    assert (
        config_error("source: {slot: s}\ntables: [{name: t}]\n")
        == "cdc.yaml: source.dsn: required key is missing"
    )
    assert config_error("source: {dsn: x}\n") == "cdc.yaml: tables: required key is missing"


def test_unknown_destination_type() -> None:
    message = config_error(with_sink("{type: pulsar, url: x}"))
    assert message == (
        "cdc.yaml: sinks[0].destination.type: must be one of 'postgres', 'webhook', 'redis_stream', "
        "'nats', 'rabbitmq', 'parquet', 'http_pull', 'kafka', 'sqs', 'sns', 'kinesis', 'typesense', 'delta', 'iceberg' (got 'pulsar')"
    )


def test_missing_destination_type() -> None:
    message = config_error(with_sink("{path: p}"))
    assert message.startswith(
        "cdc.yaml: sinks[0].destination.type: required key is missing (one of 'postgres'"
    )


def test_discriminator_tag_is_dropped_from_paths() -> None:
    message = config_error(with_sink("{type: webhook, url: 'https://h/x', timeout_ms: soon, tabel: x}"))
    assert message.splitlines() == [
        "cdc.yaml: sinks[0].destination.timeout_ms: must be an integer (got 'soon')",
        "cdc.yaml: sinks[0].destination: unknown key 'tabel' "
        "(allowed: type, url, headers, timeout_ms, hmac_secret_env, signature_header, batch_size, max_in_flight, http2)",
    ]


def test_type_and_range_errors() -> None:
    text = MINIMAL + "drain: {tick_seconds: 0, batch_rows: many}\nbackoff: 1\n"
    assert config_error(text).splitlines() == [
        "cdc.yaml: drain.tick_seconds: must be greater than 0 (got 0)",
        "cdc.yaml: drain.batch_rows: must be an integer (got 'many')",
        "cdc.yaml: unknown key 'backoff' (did you mean 'backfill'?)",
    ]


def test_several_problems_one_line_each() -> None:
    text = """\
source: {dsn: x, slot: Bad-Slot}
tables: []
sinks: [{name: s, tables: [t], actions: [insert, upsert], max_retries: -1, destination: {type: parquet}}]
"""
    assert config_error(text).splitlines() == [
        "cdc.yaml: source.slot: must be 1-63 lower-case letters, digits or underscores "
        "(PostgreSQL replication slot name rule) (got 'Bad-Slot')",
        "cdc.yaml: tables: must not be empty",
        "cdc.yaml: sinks[0].actions[1]: must be one of 'insert', 'update', 'delete' (got 'upsert')",
        "cdc.yaml: sinks[0].max_retries: must be at least 0 (got -1)",
        "cdc.yaml: sinks[0].destination.path: required key is missing",
    ]


def test_yaml_syntax_error_has_line_number() -> None:
    text = "source:\n  dsn: x\ntables:\n  - name: [orders\n"
    message = config_error(text)
    assert re.fullmatch(r"cdc\.yaml: line \d+: YAML syntax error: .+ \(column \d+\)", message), message
    bad_indent = "source:\n  dsn: x\n tables: []\n"
    assert config_error(bad_indent).startswith("cdc.yaml: line 3: YAML syntax error: ")


def test_yaml_unsafe_tags_are_rejected() -> None:
    message = config_error("source: !!python/object/apply:os.system ['true']\n")
    assert message.startswith("cdc.yaml: line 1: YAML syntax error: could not determine a constructor")


def test_duplicate_yaml_keys() -> None:
    text = "source: {dsn: x}\ntables: [{name: a}]\nsinks: []\ntables: [{name: b}]\n"
    assert (
        config_error(text)
        == "cdc.yaml: line 4: duplicate key 'tables' (each key may appear once per mapping)"
    )


def test_yaml_merge_keys_are_not_duplicates() -> None:
    text = """\
source: {dsn: x}
tables: [{name: t}]
x-base: &base {type: parquet, path: a}
sinks:
  - {name: s, tables: [t], destination: {<<: *base, path: b}}
"""
    # `x-base` is an unknown key, but the merge itself must not be reported as a duplicate.
    message = config_error(text)
    assert "duplicate" not in message
    assert (
        message
        == "cdc.yaml: unknown key 'x-base' (allowed: source, state, spark, drain, delivery, backfill, metrics, tables, sinks, "
            "api_sources)"
    )


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n", "~\n"])
def test_empty_file(text: str) -> None:
    assert config_error(text).startswith("cdc.yaml: file is empty")


@pytest.mark.parametrize(
    ("text", "kind"), [("- a\n- b\n", "a list"), ("just text\n", "a string"), ("42\n", "a number")]
)
def test_top_level_not_a_mapping(text: str, kind: str) -> None:
    assert (
        config_error(text)
        == f"cdc.yaml: top level must be a mapping with source, tables, sinks, ... (got {kind})"
    )


def test_partitions_require_sort_column() -> None:
    text = "source: {dsn: x}\ntables: [{name: t, partitions: {kind: daily, start: 2024-01-01}}]\n"
    assert config_error(text) == (
        "cdc.yaml: tables[0].partitions: requires sort_column (partitions are windows of the sort column)"
    )


def test_partition_bounds() -> None:
    base = "source: {dsn: x}\ntables: [{name: t, sort_column: c, partitions: %s}]\n"
    assert config_error(base % "{start: yesterday}") == (
        "cdc.yaml: tables[0].partitions.start: must be a date or datetime (ISO 8601) for kind 'daily' "
        "(got 'yesterday')"
    )
    assert config_error(base % "{kind: integer, start: '2024-01-01'}").startswith(
        "cdc.yaml: tables[0].partitions.start: must be an integer for kind 'integer'"
    )
    assert config_error(base % "{start: 2024-01-01, step: 5}") == (
        "cdc.yaml: tables[0].partitions.step: only applies to kind 'integer' (kind is 'daily')"
    )
    assert config_error(base % "{kind: integer, start: 10, end: 5}") == (
        "cdc.yaml: tables[0].partitions.end: must be after start (10) (got '5')"
    )
    assert config_error(base % "{kind: yearly, start: 2024-01-01}").startswith(
        "cdc.yaml: tables[0].partitions.kind: must be one of 'daily', 'hourly', 'weekly', 'monthly', 'integer'"
    )


def test_unknown_sink_table() -> None:
    text = with_sink("{type: parquet, path: p}").replace("tables: [orders]", "tables: [orders, invoices]")
    assert config_error(text) == (
        "cdc.yaml: sinks[0].tables[1]: unknown table 'public.invoices' (configured tables: public.orders)"
    )


def test_duplicate_table_names() -> None:
    text = "source: {dsn: x}\ntables: [{name: orders}, {name: public.orders}]\n"
    assert config_error(text) == "cdc.yaml: tables[1].name: duplicate table 'public.orders' (also tables[0])"


def test_duplicate_sink_names() -> None:
    text = (
        with_sink("{type: parquet, path: p}")
        + "  - {name: s1, tables: [orders], destination: {type: nats}}\n"
    )
    assert config_error(text) == "cdc.yaml: sinks[1].name: duplicate sink 's1' (also sinks[0])"


def test_group_columns_must_not_be_empty() -> None:
    text = "source: {dsn: x}\ntables: [{name: t, group_columns: []}]\n"
    assert config_error(text) == "cdc.yaml: tables[0].group_columns: must not be empty"


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        (
            "tables: [{name: 'a.b.c'}]",
            "cdc.yaml: tables[0].name: must be 'schema.table' or 'table' (got 'a.b.c')",
        ),
        ("tables: [{name: t, sort_column: 'x y'}]", "cdc.yaml: tables[0].sort_column: must be an identifier"),
        (
            "tables: [{name: t}]\nstate: {schema: 'bad-schema'}",
            "cdc.yaml: state.schema: must be an identifier",
        ),
        (
            "tables: [{name: t}]\nbackfill: {initial_page_size: 10, max_page_size: 5}",
            "cdc.yaml: backfill.initial_page_size: must not exceed max_page_size (5) (got 10)",
        ),
        (
            "tables: [{name: t}]\ndelivery: {lag_trigger_messages: 0}",
            "cdc.yaml: delivery.lag_trigger_messages: must be at least 1 (got 0)",
        ),
        (
            "tables: [{name: t}]\nsource: {dsn: x, publication: '9pub'}",
            "cdc.yaml: source.publication: must be an identifier",
        ),
    ],
)
def test_field_rules(snippet: str, expected: str) -> None:
    text = snippet if "source:" in snippet else "source: {dsn: x}\n" + snippet
    assert config_error(text + "\n").startswith(expected)


@pytest.mark.parametrize(
    ("destination", "expected"),
    [
        ("{type: webhook, url: 'ftp://h/x'}", "sinks[0].destination.url: must be an http:// or https:// URL"),
        (
            "{type: redis_stream, url: 'http://h'}",
            "sinks[0].destination.url: must be a URL starting with redis://",
        ),
        ("{type: nats, subject: 'a b'}", "sinks[0].destination.subject: must be dot-separated tokens"),
        (
            "{type: rabbitmq, exchange_type: x}",
            "sinks[0].destination.exchange_type: must be one of 'topic', 'direct', 'fanout', 'headers'",
        ),
        (
            "{type: webhook, url: 'https://h', headers: {'bad header': v}}",
            "sinks[0].destination.headers['bad header']: is not a valid HTTP header name",
        ),
        (
            "{type: webhook, url: 'https://h', headers: {X-A: \"a\\r\\nX-B: b\"}}",
            "sinks[0].destination.headers.X-A: must not contain line breaks",
        ),
        ("{type: redis_stream, maxlen: 0}", "sinks[0].destination.maxlen: must be greater than 0"),
    ],
)
def test_destination_rules(destination: str, expected: str) -> None:
    assert config_error(with_sink(destination)).startswith("cdc.yaml: " + expected)


def test_sink_rules() -> None:
    text = with_sink(
        "{type: parquet, path: p}",
        "    backoff: {initial_ms: 5000, max_ms: 1000, jitter: 2}\n    batch_size: 0\n",
    ).replace("name: s1", "name: 'bad name'")
    assert config_error(text).splitlines() == [
        "cdc.yaml: sinks[0].name: must be 1-63 letters, digits, '_' or '-' (got 'bad name')",
        "cdc.yaml: sinks[0].backoff.jitter: must be at most 1 (got 2)",
        "cdc.yaml: sinks[0].batch_size: must be greater than 0 (got 0)",
    ]
    text = with_sink("{type: parquet, path: p}", "    backoff: {initial_ms: 5000, max_ms: 1000}\n")
    assert (
        config_error(text)
        == "cdc.yaml: sinks[0].backoff.max_ms: must be at least initial_ms (5000) (got 1000)"
    )


def test_source_name_is_used_verbatim() -> None:
    assert config_error("- x\n", source="/etc/cdc/prod.yaml").startswith("/etc/cdc/prod.yaml: top level")


def test_config_error_problems_attribute() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("source: {dsn: x, slot: A}\ntables: []\n", "cdc.yaml", {})
    assert len(info.value.problems) == 2
    assert "\n".join(info.value.problems) == str(info.value)


# --------------------------------------------------------------------------------------------------
# Redaction
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://u:pw@h/db", "postgresql://u:***@h/db"),
        (
            "postgresql://u:p@ss#w?rd@h:5432/db?sslmode=require",
            "postgresql://u:***@h:5432/db?sslmode=require",
        ),
        ("redis://:sekret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("amqp://guest:guest@127.0.0.1:5672/%2F", "amqp://guest:***@127.0.0.1:5672/%2F"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("http://h:8080/a@b", "http://h:8080/a@b"),
        ("host=h password=secret dbname=x", "host=h password=*** dbname=x"),
        ("host=h password='se cret' dbname=x", "host=h password=*** dbname=x"),
        ("postgresql://h/db?sslpassword=abc&x=1", "postgresql://h/db?sslpassword=***&x=1"),
        ('{"api_key": "k", "n": 1}', '{"api_key": ***, "n": 1}'),
        ("Authorization: Bearer abcdefghijkl", "Authorization: Bearer ***"),
        ("environment variable DB_PASSWORD is not set", "environment variable DB_PASSWORD is not set"),
        (
            "headers.Authorization: must not contain line breaks",
            "headers.Authorization: must not contain line breaks",
        ),
        ("dsn=a url=b", "dsn=a url=b"),
    ],
)
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_errors_never_show_dsn_passwords() -> None:
    dsn = "postgresql://writer:hunter2@warehouse/analytics"
    # A DSN pasted into the wrong field is echoed, but redacted.
    message = config_error(with_sink(f"{{type: postgres, dsn: d, table: t, mode: '{dsn}'}}"))
    assert "hunter2" not in message
    assert "postgresql://writer:***@warehouse/analytics" in message
    # The value of a sensitive field is never echoed at all.
    message = config_error(f"source: {{dsn: ['{dsn}']}}\ntables: [{{name: t}}]\n")
    assert message == "cdc.yaml: source.dsn: must be a string (got a list)"
    message = config_error(with_sink("{type: webhook, url: 'ftp://u:hunter2@h'}"))
    assert "hunter2" not in message


def test_yaml_errors_do_not_leak_passwords() -> None:
    message = config_error("source:\n  dsn: postgresql://u:hunter2@h/db: oops\ntables: []\n")
    assert "hunter2" not in message
    assert message.startswith("cdc.yaml: line 2: YAML syntax error")


def test_hmac_secret_env_rejects_a_secret_without_echoing_it() -> None:
    message = config_error(with_sink("{type: webhook, url: 'https://h', hmac_secret_env: 'whsec_9f8e7d!x'}"))
    assert message == (
        "cdc.yaml: sinks[0].destination.hmac_secret_env: must be the NAME of an environment variable "
        "holding the secret (e.g. WEBHOOK_SECRET), never the secret itself"
    )
    assert "whsec" not in message


def test_interpolated_secrets_are_not_echoed() -> None:
    text = with_sink("{type: postgres, dsn: d, table: t, mode: '${MODE}'}")
    message = config_error(text, {"MODE": "postgresql://u:topsecret@h/db"})
    assert "topsecret" not in message


def test_config_error_redacts_its_message() -> None:
    assert (
        str(ConfigError("cannot connect to postgresql://u:pw@h/db"))
        == "cannot connect to postgresql://u:***@h/db"
    )


def test_model_validation_error_hides_input() -> None:
    # Code that builds models directly gets pydantic's errors, which must not print the DSN either.
    with pytest.raises(ValidationError) as info:
        PipelineConfig(source={"dsn": "postgresql://u:hunter2@h/db", "slot": "BAD"}, tables=[])  # type: ignore[arg-type]
    assert "hunter2" not in str(info.value)


def test_environ_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_TEST_DSN", "postgresql://from-os/db")
    cfg = parse_config("source: {dsn: '${CDC_TEST_DSN}'}\ntables: [{name: t}]\n", "c")
    assert cfg.source.dsn == "postgresql://from-os/db"
    assert os.environ["CDC_TEST_DSN"] == cfg.state_dsn
