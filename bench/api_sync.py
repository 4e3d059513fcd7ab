"""API sync backfill rate at a given budget (not part of the test suite).

    python bench/api_sync.py                      # 20,000 records, page 200, 20 requests/s allowed
    python bench/api_sync.py --records 50000 --page 500 --requests 100 --per-seconds 10

A fake Salesforce-style API (the tests' own, a real local HTTP server) holds the records; the real
sync backfills them into a throwaway PostgreSQL. Reported: records/s, requests/s, and the budget's
ceiling (page x budget / window), so the rate can be read as a fraction of what the budget allows.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg  # noqa: E402
import yaml  # noqa: E402

from cdc_pipeline.api_sync.budget import Quota  # noqa: E402
from cdc_pipeline.api_sync.loop import ApiSync  # noqa: E402
from cdc_pipeline.config import load_config  # noqa: E402
from cdc_pipeline.postgres import embedded  # noqa: E402
from cdc_pipeline_tests.api_fakes import T0, FakeApi  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=20000)
    p.add_argument("--page", type=int, default=200)
    p.add_argument("--requests", type=int, default=80, help="the API's quota per window")
    p.add_argument("--per-seconds", type=float, default=2.0)
    p.add_argument("--share", type=float, default=0.5)
    args = p.parse_args()
    cluster = embedded.create()
    cluster.start(durable=False)
    try:
        with FakeApi("salesforce") as api, tempfile.TemporaryDirectory() as tmp:
            os.environ["SF_ID"], os.environ["SF_SECRET"] = api.client_id, api.client_secret
            for i in range(args.records):
                api.put("Account", f"001{i:012d}", at=T0.replace(hour=i * 24 // args.records), Name=f"account {i}",
                        AnnualRevenue=i * 1.5, Industry="Retail")
            with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
                conn.execute("CREATE DATABASE bench")
            dsn = cluster.dsn("bench")
            path = Path(tmp) / "cdc.yaml"
            path.write_text(yaml.safe_dump({"source": {"dsn": dsn}, "api_sources": [{
                "name": "sf", "type": "salesforce", "base_url": api.url,
                "auth": {"type": "oauth_client_credentials", "client_id_env": "SF_ID", "client_secret_env": "SF_SECRET"},
                "rate_limit": {"requests": args.requests, "per_seconds": args.per_seconds, "share": args.share},
                "collections": [{"name": "Account", "table": "crm.accounts", "page_size": args.page,
                                 "fields": {"Name": "text", "AnnualRevenue": "numeric", "Industry": "text"}}]}]}))
            config = load_config(path)
            started = time.monotonic()
            stats = ApiSync(config).run(until_idle=True)["sf"]
            seconds = time.monotonic() - started
            quota = Quota(args.requests, args.per_seconds, args.share)
            ceiling = args.page / quota.interval()
            print(f"{stats.records} records in {seconds:.1f} s: {stats.records / seconds:.0f} records/s, "
                  f"{stats.requests / seconds:.2f} requests/s; budget {quota.budget} per {args.per_seconds:g} s "
                  f"(one request every {quota.interval():.3f} s) allows {ceiling:.0f} records/s at page {args.page}; "
                  f"busiest {args.per_seconds:g} s window at the API: {api.max_in_window(args.per_seconds)} requests")
    finally:
        cluster.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
