"""Pure parts of operating from the UI: PostgreSQL's LSN notation and the message IDs the failed-message
jobs take (both forms round-trip), the run-config selection, and when a delivery run warns of parked
messages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_pipeline.admin.failed import Selection
from cdc_pipeline.config import ConfigError
from cdc_pipeline.core.positions import lsn_text, parse_position, position_lsn_text, position_text
from cdc_pipeline.defs.pacing import ParkedWarning

positions = st.tuples(st.integers(0, 2**63 - 1), st.integers(-1, 2**31 - 1))


def test_lsn_text_is_postgres_notation() -> None:
    assert lsn_text(0x16B374D848) == "16/B374D848" and lsn_text(0) == "0/0"
    assert position_lsn_text((59356800, 3)) == "0/389B680:3"


@given(positions)
def test_both_id_forms_parse_back(position: tuple[int, int]) -> None:
    assert parse_position(position_text(position)) == position
    assert parse_position(position_lsn_text(position)) == position


@pytest.mark.parametrize("text", ["", "12", "a:1", "1/G:2", "1/100000000:0", "12:x", "-5:1"])
def test_not_an_id(text: str) -> None:
    assert parse_position(text) is None


def test_selection_is_exactly_one_of_ids_table_all() -> None:
    assert Selection.parse(["0/10:2", "16:1"], None, False).ids == ((16, 2), (16, 1))
    assert Selection.parse([], "public.t", False).table == "public.t"
    assert Selection.parse([], None, True).every
    for ids, table, every in (([], None, False), (["1:1"], None, True), ([], "public.t", True)):
        with pytest.raises(ConfigError, match="exactly one of ids, table or all"):
            Selection.parse(ids, table, every)
    with pytest.raises(ConfigError, match="ids: 'x' is not a message ID"):
        Selection.parse(["x"], None, False)
    with pytest.raises(ConfigError, match="table: 't' is not schema.table"):
        Selection.parse([], "t", False)


def test_parked_warning_at_once_then_rate_limited() -> None:
    w = ParkedWarning(every=60, remind=900)
    assert not w.due(0, 0.0)
    assert w.due(1, 1.0)  # the first parked message: at once
    assert not w.due(1, 5.0) and not w.due(3, 30.0)  # more within a minute: not yet
    assert w.due(3, 61.0)  # the number changed, a minute on
    assert not w.due(3, 200.0)  # unchanged: only the reminder
    assert w.due(3, 961.0)
    assert not w.due(0, 962.0) and not w.due(1, 963.0)  # all resolved, then a new one: a minute on
    assert w.due(1, 1021.0)


def test_a_dagster_origin_names_the_run_backfill_and_partition() -> None:
    from cdc_pipeline.core.backfill_origin import dagster_links, dagster_origin, started_by

    origin = dagster_origin("0a1b-2c", None, "qzvxpkwe", "2025-01-02")
    assert origin == "dagster run 0a1b-2c, dagster backfill qzvxpkwe, partition 2025-01-02"
    assert dagster_links(origin) == {"dagster_run_id": "0a1b-2c", "dagster_backfill_id": "qzvxpkwe",
                                     "dagster_partition": "2025-01-02"}
    retry = dagster_origin("ff01", "0a1b-2c")
    assert dagster_links(retry)["dagster_run_id"] == "0a1b-2c"  # the first run, which the retry resumes
    assert started_by(origin, "ff01", "0a1b-2c") and started_by(retry, "0a1b-2c", None)
    assert not started_by(origin, "ff01", None) and not started_by("cli", "cli", None)
    assert dagster_links("cli") == {"dagster_run_id": None, "dagster_backfill_id": None, "dagster_partition": None}
