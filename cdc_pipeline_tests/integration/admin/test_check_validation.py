"""`cdc-pipeline check` analyzes each sink's filter, transform and route with Spark against the source's
real column types, so a bad expression is a config error found before any delivery runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_pipeline.admin.setup import setup
from cdc_pipeline.cli import main
from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.delivery.validate import validate_sinks
from cdc_pipeline_tests.conftest import Database

EXAMPLE = "cdc_pipeline_tests.transforms_example"
GOOD_FILTER = "record.amount > 100 AND action <> 'delete'"
GOOD_TRANSFORM = {"id": "record.id", "total": "record.amount * 2", "kind": "action", "tbl": "metadata.table_name"}
GOOD_ROUTE = "concat('cdc.', metadata.table_name)"

# sink name -> (sink keys, expected subject, fragments the message must contain); None = no error.
CASES: dict[str, tuple[dict[str, Any], str | None, tuple[str, ...]]] = {
    "good_all": ({"filter": GOOD_FILTER, "transform": GOOD_TRANSFORM, "route": GOOD_ROUTE}, None, ()),
    "good_changes": ({"filter": "changes.amount IS NOT NULL AND metadata.commit_lsn > 0"}, None, ()),
    "good_python": ({"transform": f"{EXAMPLE}:enrich"}, None, ()),
    "bad_syntax": ({"filter": "record.amount >"}, "filter",
                   ("PARSE_SYNTAX_ERROR", "(tables public.orders, public.payments)")),
    "unknown_column": ({"filter": "record.amout > 100"}, "filter", ("FIELD_NOT_FOUND", "`amout`")),
    "unknown_top_level": ({"filter": "recrd.amount > 100"}, "filter", ("UNRESOLVED_COLUMN", "`recrd`")),
    "not_boolean": ({"filter": "record.amount + 1"}, "filter", ("not a boolean",)),
    "bad_transform_syntax": ({"transform": {"id": "record.id", "total": "record.amount *"}}, "transform.total",
                             ("PARSE_SYNTAX_ERROR",)),
    "bad_transform_function": ({"transform": {"x": "no_such_fn(record.id)"}}, "transform.x",
                               ("UNRESOLVED_ROUTINE", "no_such_fn")),
    "unimportable": ({"transform": "cdc_pipeline_tests.no_such_module:enrich"}, "transform",
                     ("ModuleNotFoundError", "no_such_module")),
    "no_such_function": ({"transform": f"{EXAMPLE}:nope"}, "transform", ("AttributeError", "nope")),
    "not_callable": ({"transform": f"{EXAMPLE}:not_callable"}, "transform", ("TypeError", "not callable")),
    "raises_on_empty": ({"transform": f"{EXAMPLE}:missing_column"}, "transform",
                        ("raised on an empty batch", "no_such_column")),
    "drops_bookkeeping": ({"transform": f"{EXAMPLE}:drops_bookkeeping"}, "transform",
                          ("lacks column(s) commit_lsn, commit_idx, group_key, route",)),
    "bad_route": ({"route": "concat('cdc.', metadata.tablename)"}, "route", ("FIELD_NOT_FOUND", "`tablename`")),
}


def _config(source_dsn: str, sinks: dict[str, dict[str, Any]], path: Path) -> PipelineConfig:
    data = {
        "source": {"dsn": source_dsn, "slot": "cdc_check", "publication": "cdc_check"},
        "spark": {"master": "local[2]"},
        "tables": [{"name": "public.orders"}, {"name": "public.payments"}],
        # Nothing listens there: check must never contact a sink.
        "sinks": [{"name": name, "tables": ["public.orders", "public.payments"], **keys,
                   "destination": {"type": "webhook", "url": "http://127.0.0.1:9/never"}}
                  for name, keys in sinks.items()],
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config(path)


@pytest.fixture
def source(source_db: Database) -> Database:
    source_db.execute(
        "CREATE TABLE orders (id int PRIMARY KEY, account_id int NOT NULL, amount numeric(12,2), status text);"
        "CREATE TABLE payments (id int PRIMARY KEY, account_id int NOT NULL, amount numeric(12,2), method text)")
    return source_db


def _check(config: PipelineConfig, capfd: pytest.CaptureFixture[str]) -> tuple[int, dict[str, str], str]:
    code = main(["--config", str(config.path), "check"])
    out, err = capfd.readouterr()
    findings: dict[str, str] = {}
    for line in out.splitlines():
        level, _, rest = line.partition(" ")
        subject, _, message = rest.strip().partition(": ")
        key = f"{level} {subject}"
        findings[key] = f"{findings[key]}\n{message}" if key in findings else message
    return code, findings, err


def test_check_rejects_bad_filters_transforms_and_routes(source: Database, spark: Any, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    config = _config(source.dsn, {name: keys for name, (keys, _, _) in CASES.items()}, tmp_path / "cdc.yaml")
    setup(config)
    code, findings, err = _check(config, capfd)
    assert code == 1
    assert findings.get("OK source") == "ready for change data capture"  # the source itself is fine
    for name, (_, key, fragments) in CASES.items():
        if key is None:
            assert f"OK sinks.{name}" in findings, (name, findings)
            assert not any(k.startswith(f"ERROR sinks.{name}.") for k in findings), (name, findings)
            continue
        message = findings.get(f"ERROR sinks.{name}.{key}")
        assert message is not None, (name, sorted(findings))
        for fragment in fragments:
            assert fragment in message, (name, fragment, message)
        if name in ("bad_syntax", "unimportable"):  # the same complaint for both tables: one line
            assert "\n" not in message and "tables public.orders, public.payments" in message, message
        first = message.splitlines()[0]
        assert "== SQL ==" not in message and len(first) < 400, first  # Spark's first line, not a plan dump
    # Analysis errors are findings, not logged stack traces.
    assert "Py4JJavaError" not in err and "Traceback" not in err, err[:2000]


def test_filter_valid_for_one_table_only_names_the_other(source: Database, spark: Any, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    # `status` exists in orders but not in payments: the stage would fail on every payments batch.
    config = _config(source.dsn, {"mixed": {"filter": "record.status = 'paid'"}}, tmp_path / "cdc.yaml")
    setup(config)
    code, findings, _ = _check(config, capfd)
    assert code == 1
    message = findings["ERROR sinks.mixed.filter"]
    assert "`status`" in message and "(table public.payments)" in message and "public.orders" not in message


def test_good_config_passes_check(source: Database, spark: Any, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    good = {name: keys for name, (keys, key, _) in CASES.items() if key is None}
    config = _config(source.dsn, good, tmp_path / "cdc.yaml")
    setup(config)
    code, findings, _ = _check(config, capfd)
    assert code == 0, findings
    assert {k for k in findings if k.startswith("OK sinks.")} == {f"OK sinks.{n}" for n in good}
    assert findings["OK sinks.good_all"] == "filter, transform, route analyzed against public.orders, public.payments"


def test_sinks_without_expressions_do_not_start_spark(source: Database, tmp_path: Path) -> None:
    config = _config(source.dsn, {"plain": {}, "by_action": {"actions": ["insert"]}}, tmp_path / "cdc.yaml")

    def no_spark() -> Any:
        raise AssertionError("Spark was started for a config without filter/transform/route")

    assert validate_sinks(config, {}, spark_factory=no_spark) == []
