"""Measured max lag: 5 collections sharing one request every I seconds are each polled every 5 x I, so a
change made just after a collection's poll waits about 5 x I (the seed: one request per 3 s, five
collections, about 15 s); while a delete check runs, a round carries one page of it: (5 + 1) x I. The suite runs it at I = 0.42 s; API_SYNC_LAG_WINDOW=60 runs the seed's case
(40 requests per 60 s at share 0.5 = one request per 3.05 s)."""

from __future__ import annotations

import os
import threading
import time

from cdc_pipeline.api_sync import lag
from cdc_pipeline.api_sync.loop import ApiSync
from cdc_pipeline_tests.api_fakes import FakeApi
from cdc_pipeline_tests.helpers import wait_until
from cdc_pipeline_tests.integration.api_sync.test_api_sync import api_config, rest_source

NAMES = ["a", "b", "c", "d", "e"]
LOAD_SLACK_SECONDS = 3.0  # what a loaded 2-core machine may add to a lag measured in seconds


def test_max_lag_with_five_collections_matches_the_computed_figure(source_db, write_config, monkeypatch):
    window = float(os.environ.get("API_SYNC_LAG_WINDOW", "4"))
    samples = int(os.environ.get("API_SYNC_LAG_SAMPLES", "6"))
    with FakeApi("rest") as api:
        monkeypatch.setenv("REST_TOKEN", api.bearer)
        for n in NAMES:
            api.put(n, "1", v=0)
        source = rest_source(api, [{"name": n, "table": f"lag.{n}", "fields": {"v": "integer"}} for n in NAMES])
        source["rate_limit"] = {"requests": 20 if window < 60 else 40, "per_seconds": window, "share": 0.5}
        config = write_config(api_config(source_db.dsn, source))
        sync = ApiSync(config)
        runner = threading.Thread(target=sync.run, kwargs={"seconds": 600})
        runner.start()
        armed: dict[str, float] = {}
        made: dict[str, tuple[int, float, int]] = {}

        def after_request(collection: str) -> None:  # just after a poll of `collection` was answered
            if collection in armed:
                value = int(armed.pop(collection))
                api.put(collection, "1", v=value)
                made[collection] = (value, time.monotonic(), len(api.data_log()))

        try:
            deadline = time.monotonic() + 60 * window
            while source_db.execute("SELECT count(*) FROM cdc_pipeline.api_sync_collections WHERE phase = 'sync'"
                                    if source_db.execute("SELECT to_regclass('cdc_pipeline.api_sync_collections')")[0][0]
                                    else "SELECT 0")[0][0] < len(NAMES):
                assert time.monotonic() < deadline
                time.sleep(0.2)
            api.on_request = after_request
            lags = []
            for k in range(samples):
                name = NAMES[k % len(NAMES)]
                armed[name] = k + 1
                wait_until(lambda n=name: n in made, 60 * window, f"a poll of {name}")
                value, t0, n0 = made.pop(name)
                query = f"SELECT v FROM lag.{name} WHERE id = '1'"
                wait_until(lambda q=query, v=value: source_db.execute(q)[0][0] == v, 10 * window,
                           f"the change to {name}")
                lags.append(time.monotonic() - t0)
                # The schedule, whatever the machine's load: the change came with the collection's next poll,
                # after one poll of each other collection.
                after = [e.collection for e in api.data_log()[n0:]]
                assert sorted(after[:after.index(name)]) == sorted(set(NAMES) - {name}), after
        finally:
            sync.stop()
            runner.join(30)
        computed = lag.collect(config)["tickets"]["computed_max_lag_seconds"]
        observed = lag.collect(config)["tickets"]["collections"]["a"]["observed_max_lag_seconds"]
        print(f"computed max lag {computed} s; measured lags {[round(x, 2) for x in lags]}; "
              f"observed by the sync {observed} s")
        budget = source["rate_limit"]["requests"] // 2
        interval = (window + max(0.2, min(0.05 * window, 1.0))) / budget
        # The figure counts a delete-check page per round (REST); no check ran here: five polls a round.
        assert computed == round(6 * interval, 3)
        steady = 5 * interval
        # Never sooner than the budget allows; later only by what a loaded machine adds (a generous bound:
        # the schedule itself is checked in requests above).
        slack = LOAD_SLACK_SECONDS + 0.2 * steady
        assert 0.8 * steady <= max(lags) and all(x <= steady + slack for x in lags), lags
        assert observed is not None and 0.8 * steady <= observed <= steady + slack


def test_a_delete_sweep_does_not_starve_polling(source_db, write_config, monkeypatch):
    """An 8-page full-id sweep of `a` runs again and again; changes to `a` and `b` made while it has six,
    five, three and two pages to go (all four in one sweep) are in their tables within the computed max
    lag, which counts the sweep's slot. (A delete takes two sweeps to confirm, so the sweep's length sets
    this test's duration: 8 pages keep a sweep well in progress around each change.)"""
    with FakeApi("rest") as api:
        monkeypatch.setenv("REST_TOKEN", api.bearer)
        for i in range(40):
            api.put("a", f"{i:03d}", v=0)
        api.put("b", "1", v=0)
        source = rest_source(api, [{"name": n, "table": f"sweep.{n}", "fields": {"v": "integer"}, "page_size": 5}
                                   for n in ("a", "b")], delete_check_seconds=1)
        source["rate_limit"] = {"requests": 20, "per_seconds": 4, "share": 0.5}  # one request per 0.42 s
        config = write_config(api_config(source_db.dsn, source))
        sync = ApiSync(config)
        runner = threading.Thread(target=sync.run, kwargs={"seconds": 300})
        runner.start()
        armed: list[tuple[str, str, int]] = []
        made: list[tuple[str, str, int, float]] = []
        sweep_page = {"n": 0}

        def after_request(collection: str) -> None:
            query = api.data_log()[-1].query
            if collection != "a" or "updated_since" in query:
                return  # a poll
            sweep_page["n"] = sweep_page["n"] + 1 if "cursor" in query else 1
            if sweep_page["n"] in (2, 3, 5, 6) and armed:  # six, five, three, two sweep pages to go
                name, rid, value = armed.pop()
                api.put(name, rid, v=value)
                made.append((name, rid, value, time.monotonic()))

        try:
            deadline = time.monotonic() + 120
            while source_db.execute("SELECT count(*) FROM cdc_pipeline.api_sync_collections WHERE phase = 'sync'"
                                    if source_db.execute("SELECT to_regclass('cdc_pipeline.api_sync_collections')")[0][0]
                                    else "SELECT 0")[0][0] < 2:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            api.delete("a", "007")  # the sweep still finds deletes
            api.on_request = after_request
            lags = []
            for k, (name, rid) in enumerate([("a", "030"), ("b", "1"), ("a", "039"), ("b", "1")]):
                armed.append((name, rid, k + 1))
                while not made:
                    assert time.monotonic() < deadline + 120
                    time.sleep(0.01)
                name, rid, value, t0 = made.pop()
                while source_db.execute(f"SELECT v FROM sweep.{name} WHERE id = %s", (rid,))[0][0] != value:
                    assert time.monotonic() - t0 < 30
                    time.sleep(0.02)
                lags.append(time.monotonic() - t0)
            while source_db.execute("SELECT count(*) FROM sweep.a WHERE id = '007'")[0][0]:
                assert time.monotonic() < deadline + 180
                time.sleep(0.1)
        finally:
            sync.stop()
            runner.join(30)
        figures = lag.collect(config)["tickets"]
        computed = figures["computed_max_lag_seconds"]
        print(f"computed max lag {computed} s; lags during a sweep {[round(x, 2) for x in lags]}")
        interval = (4 + 0.2) / 10
        assert computed == round(3 * interval, 3)  # two collections' polls and one sweep page per round
        assert all(x <= 1.25 * computed for x in lags), lags
        assert figures["collections"]["a"]["records_deleted"] == 1
