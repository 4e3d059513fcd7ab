"""Measured max lag: 5 collections sharing one request every I seconds are each polled every 5 x I, so a
change made just after a collection's poll waits about 5 x I (the seed: one request per 3 s, five
collections, about 15 s). The suite runs it at I = 0.42 s; API_SYNC_LAG_WINDOW=60 runs the seed's case
(40 requests per 60 s at share 0.5 = one request per 3.05 s)."""

from __future__ import annotations

import os
import threading
import time

from cdc_pipeline.api_sync import lag
from cdc_pipeline.api_sync.loop import ApiSync
from cdc_pipeline_tests.api_fakes import FakeApi
from cdc_pipeline_tests.integration.test_api_sync import api_config, rest_source

NAMES = ["a", "b", "c", "d", "e"]


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
        made: dict[str, tuple[int, float]] = {}

        def after_request(collection: str) -> None:  # just after a poll of `collection` was answered
            if collection in armed:
                value = int(armed.pop(collection))
                api.put(collection, "1", v=value)
                made[collection] = (value, time.monotonic())

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
                while name not in made:
                    time.sleep(0.01)
                value, t0 = made.pop(name)
                while source_db.execute(f"SELECT v FROM lag.{name} WHERE id = '1'")[0][0] != value:
                    assert time.monotonic() - t0 < 10 * window
                    time.sleep(0.02)
                lags.append(time.monotonic() - t0)
        finally:
            sync.stop()
            runner.join(30)
        computed = lag.collect(config)["tickets"]["computed_max_lag_seconds"]
        observed = lag.collect(config)["tickets"]["collections"]["a"]["observed_max_lag_seconds"]
        print(f"computed max lag {computed} s; measured lags {[round(x, 2) for x in lags]}; "
              f"observed by the sync {observed} s")
        budget = source["rate_limit"]["requests"] // 2
        assert computed == round(5 * (window + max(0.2, min(0.05 * window, 1.0))) / budget, 3)
        assert abs(max(lags) - computed) <= 0.2 * computed
        assert all(x <= 1.2 * computed for x in lags)
        assert observed is not None and abs(observed - computed) <= 0.2 * computed
