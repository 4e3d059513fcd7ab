"""Two lanes of one lake mirror (one `deliver` process, both lanes at once) write the same table: each commit
that loses the race to the other lane is done again on the table's new version (before that was handled, a
lane stopped the run with delta-rs' "a concurrent transaction added new data" / pyiceberg's ValidationException);
the table equals the source."""
from __future__ import annotations

import psycopg
import pytest

from cdc_pipeline.admin.setup import setup
from cdc_pipeline_tests import processes
from cdc_pipeline_tests.helpers import drain
from cdc_pipeline_tests.lake import by_key, lake_config, read_table


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_two_lanes_one_table(fmt, source_db, write_config, tmp_path):
    source_db.execute("CREATE TABLE ev (id int PRIMARY KEY, v int)")
    data = lake_config(source_db.dsn, ["public.ev"], fmt, "mirror", tmp_path)
    data["sinks"][0]["lanes"] = 2
    data["delivery"] = {"batch_size": 300}
    config = write_config(data)
    setup(config)
    source_db.execute("INSERT INTO ev SELECT g, 0 FROM generate_series(1, 3000) g")
    source_db.execute("UPDATE ev SET v = v + 1 WHERE id % 3 = 0")
    drain(config)
    proc = processes.spawn(config.path, "deliver", "--until-idle")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    with psycopg.connect(source_db.dsn) as conn:
        want = {r[0]: tuple(r) for r in conn.execute("SELECT id, v FROM ev").fetchall()}
    assert by_key(read_table(config, "public.ev"), "id", ["id", "v"]) == want
