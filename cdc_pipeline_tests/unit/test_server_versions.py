"""The pure cores of issue 33: what a server version enables or lacks, and what counts as a failover."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cdc_pipeline.capture.source_server import SourceServer, failover_between
from cdc_pipeline.postgres.server import FEATURES, ServerVersion


@given(st.integers(min_value=90000, max_value=199999))
def test_every_feature_is_either_enabled_or_lacking(num: int) -> None:
    level, text = ServerVersion(num, f"{num // 10000}.{num % 100}").summary()
    if num < 140000:
        assert level == "error" and "14+" in text
        return
    assert level == "ok"
    for since, _, what in FEATURES:
        enabled, lacking = text.split("; lacks ")[0] if "; lacks " in text else text, text.partition("; lacks ")[2]
        assert (what in enabled) == (num >= since) and (what in lacking) == (num < since), (num, what)


def test_failover_slots_and_standby_decoding_by_version() -> None:
    assert [ServerVersion(n, "").has("failover_slots") for n in (160015, 170000, 180006)] == [False, True, True]
    assert [ServerVersion(n, "").has("standby_decoding") for n in (150019, 160000)] == [False, True]


def test_a_failover_is_another_server_or_timeline() -> None:
    a = SourceServer("h1:5432", "17.11", 1, "42", False)
    assert not failover_between(None, a)
    assert not failover_between(a, a)
    assert failover_between(a, SourceServer("h2:5433", "17.11", 2, "42", False))
    assert failover_between(a, SourceServer("h1:5432", "17.11", 2, "42", False))  # promoted in place
