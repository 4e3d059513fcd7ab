"""The test set-up's primary + physical standby (cdc_pipeline_tests/standby.py) as later tests count on it:
the standby replays the primary's writes, and on 17+ a failover slot's synced copy survives a promotion."""

from __future__ import annotations

import psycopg
import pytest

from cdc_pipeline_tests import standby as sb


@pytest.mark.parametrize("major", [17, 18], ids=lambda m: f"pg{m}")
def test_failover_slot_survives_a_promotion(major: int) -> None:
    with sb.primary_and_standby(major, sync_slots=True) as pair:
        with psycopg.connect(pair.primary.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
            conn.execute("SELECT pg_create_logical_replication_slot('s1', 'test_decoding', false, false, true)")
            conn.execute("INSERT INTO t VALUES (1)")
        # Consumed past the standby's replay point: else its copy stays temporary (issue 33's trap).
        sb.wait_slot_synced(pair.primary, pair.standby, "s1", consume=True)
        with psycopg.connect(pair.primary.dsn(), autocommit=True) as conn:
            conn.execute("INSERT INTO t VALUES (2)")
        sb.wait_caught_up(pair.primary, pair.standby)
        pair.primary.stop()
        sb.promote(pair.standby)
        with psycopg.connect(pair.multi_host_dsn("postgres"), autocommit=True) as conn:
            assert conn.info.port == pair.standby.port  # the multi-host DSN found the new primary
            changes = [r[0] for r in conn.execute(
                "SELECT data FROM pg_logical_slot_get_changes('s1', NULL, NULL) WHERE data LIKE 'table%'")]
        assert changes == ["table public.t: INSERT: id[integer]:2"]
