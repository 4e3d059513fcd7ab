"""The lake sinks' pure cores: a mirror batch reduced to one effect per key equals applying its changes one by
one (hypothesis); values converted to the lake types exactly (dates and timestamps of any year, BC included,
against Python's own calendar); the marks never at or past a parked message; the gather wait."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_pipeline.delivery.reader import gather_wait
from cdc_pipeline.sinks.lake import values
from cdc_pipeline.sinks.lake.effects import Change, reduce
from cdc_pipeline.sinks.lake.position import (
    Marks,
    delta_app_ids,
    delta_read,
    delta_versions,
    iceberg_properties,
    iceberg_read,
)

COLUMNS = ("k", "a", "b")


@st.composite
def batches(draw: Any) -> tuple[dict[int, dict[str, Any]], list[Change]]:
    """A table before the batch and a valid batch of changes (updates only of rows that exist, inserts only
    of rows that do not; an update may leave `b` out, as PostgreSQL does with an unchanged TOAST value)."""
    initial = {k: {"k": k, "a": draw(st.integers(0, 9)), "b": f"b{k}"} for k in draw(st.sets(st.integers(0, 6)))}
    live = set(initial)
    changes: list[Change] = []
    for _ in range(draw(st.integers(0, 25))):
        op = draw(st.sampled_from(["insert", "update", "update", "delete", "key", "truncate"]))
        free = [k for k in range(10) if k not in live]
        if op == "truncate" and draw(st.booleans()):
            changes.append(Change("truncate", None))
            live.clear()
        elif op == "insert" and free:
            k = draw(st.sampled_from(free))
            changes.append(Change("insert", {"k": k, "a": draw(st.integers(0, 9)), "b": draw(st.text("xy", max_size=2))}))
            live.add(k)
        elif op in ("update", "key") and live:
            k = draw(st.sampled_from(sorted(live)))
            record: dict[str, Any] = {"k": k, "a": draw(st.integers(0, 9))}
            if draw(st.booleans()):
                record["b"] = draw(st.text("xy", max_size=2))
            old = None
            if op == "key" and free:
                old, record["k"] = {"k": k}, draw(st.sampled_from(free))
                live.discard(k)
                live.add(record["k"])
            changes.append(Change("update", record, old))
        elif op == "delete" and live:
            k = draw(st.sampled_from(sorted(live)))
            changes.append(Change("delete", {"k": k}))
            live.discard(k)
    return initial, changes


def one_by_one(table: dict[int, dict[str, Any]], changes: list[Change]) -> dict[int, dict[str, Any]]:
    table = {k: dict(v) for k, v in table.items()}
    for c in changes:
        if c.action == "truncate":
            table.clear()
        elif c.action == "delete":
            table.pop(c.record["k"])
        elif c.action == "insert":
            table[c.record["k"]] = dict(c.record)
        else:
            old = (c.changes or {}).get("k", c.record["k"])
            table[c.record["k"]] = {**table.pop(old), **c.record}
    return table


def apply_effects(table: dict[int, dict[str, Any]], changes: list[Change]) -> dict[int, dict[str, Any]]:
    reduced = reduce(changes, ["k"], COLUMNS)
    before = {} if reduced.truncate else table
    after = {k: dict(v) for k, v in before.items()}
    for (k,), effect in reduced.by_key.items():
        if effect.delete:
            after.pop(k, None)
        else:
            base = before.get(effect.base[0], {}) if effect.partial and effect.base else {}
            after[k] = {**base, **effect.row}
    return after


@settings(max_examples=400, deadline=None)
@given(batches())
def test_reduced_batch_equals_changes_one_by_one(case):
    initial, changes = case
    assert apply_effects(initial, changes) == one_by_one(initial, changes)


@settings(max_examples=300, deadline=None)
@given(st.dates(), st.times())
def test_timestamps_and_dates_against_python(d, t):
    micros = (datetime.combine(d, t, UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    assert values.convert(f"{d.isoformat()}T{t.isoformat()}", None, pa.timestamp("us")) == micros
    assert values.convert(d.isoformat(), None, pa.date32()) == (d - date(1970, 1, 1)).days
    shifted = f"{d.isoformat()}T{t.isoformat()}+05:30"
    assert values.convert(shifted, None, pa.timestamp("us", "UTC")) == micros - 19_800_000_000


def test_values_beyond_pythons_calendar_and_refused_ones():
    # 1 BC is the astronomical year 0, a leap year: 0001-01-01 AD is 366 days after 0001-01-01 BC.
    assert values.convert("0001-01-01", None, pa.date32()) - values.convert("0001-01-01 BC", None, pa.date32()) == 366
    # PostgreSQL's last date: Julian day 2,147,483,493; 1970-01-01 is Julian day 2,440,588.
    assert values.convert("5874897-12-31", None, pa.date32()) == 2_147_483_493 - 2_440_588
    assert values.convert("4714-11-24 BC", None, pa.date32()) == -2_440_588  # Julian day 0
    big = values.loads('{"n": ' + "9" * 5000 + "}")["n"]
    assert values.convert(big, None, pa.string()) == "9" * 5000  # an unconstrained numeric: exact text
    assert values.convert(values.Num("12.30"), None, pa.decimal128(10, 2)) == Decimal("12.30")
    assert values.convert(None, "-0", pa.float64()) == 0.0 and str(values.convert(None, "-0", pa.float64())) == "-0.0"
    for value, kind in [("infinity", pa.date32()), ("294276-12-31T23:59:59.999999", pa.timestamp("us")), ("-infinity", pa.timestamp("us")), ("NaN", pa.decimal128(10, 2)),
                        ("24:00:00", pa.time64("us"))]:
        with pytest.raises(values.Unrepresentable):
            values.convert(value, None, kind)
    with pytest.raises(values.Unrepresentable):
        values.convert([5, 6], "[2:3]={5,6}", pa.list_(pa.int32()))
    with pytest.raises(values.Unrepresentable):
        values.convert([[1], [2]], None, pa.list_(pa.int32()))
    assert values.dump(values.loads('{"a": [1, 2.50, "é"], "b": {"c": null}}')) == '{"a": [1, 2.50, "é"], "b": {"c": null}}'


def test_type_mapping():
    t = values.arrow_type
    assert t("smallint", "delta") == pa.int16() and t("smallint", "iceberg") == pa.int32()
    assert t("numeric(10,2)", "delta") == pa.decimal128(10, 2)
    assert t("numeric(40,2)", "delta") == pa.string() and t("numeric", "iceberg") == pa.string()
    assert t("numeric(3,-6)", "delta") == pa.string()
    assert t("timestamp(3) with time zone", "delta") == pa.timestamp("us", "UTC")
    assert t("time without time zone", "iceberg") == pa.time64("us") and t("time(0) without time zone", "delta") == pa.string()
    assert t("integer[]", "delta") == pa.list_(pa.int32())
    assert t("interval", "iceberg") == pa.string() and t("int4range", "delta") == pa.string()
    assert values.base_type("mood", 20000, None, 16384) == "text"
    assert values.base_type("dnum", 20001, "numeric(10,2)", 16384) == "numeric(10,2)"


def test_marks_round_trip_and_stay_below_a_parked_message():
    marks = Marks.of((500, 7), (500, 3))
    assert marks == Marks((500, 2), (500, 7))
    assert Marks.of((500, 7), None) == Marks((500, 7), (500, 7))
    versions = delta_versions(marks)
    by_app = {app: versions[name] for name, app in delta_app_ids("s").items()}
    assert delta_read("s", by_app.get) == marks and delta_read("other", by_app.get) is None
    assert iceberg_read("s", iceberg_properties("s", marks)) == marks
    assert iceberg_read("t", iceberg_properties("s", marks)) is None


def test_gather_wait():
    assert gather_wait(10, 5, 1000, False, 0, None) == 10  # the log's end: wait to gather
    assert gather_wait(10, 1000, 1000, False, 0, None) == 0  # a backlog: at once
    assert gather_wait(10, 5, 1000, True, 0, None) == 0  # a one-off catch-up
    assert gather_wait(10, 5, 1000, False, 25, 30) == 5  # within the run's time
    assert gather_wait(0, 5, 1000, False, 0, None) == 0
