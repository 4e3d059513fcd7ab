"""Retakes the quickstart's screenshots (docs/images/*.png) from the demo, as a user sees it: starts
`cdc-pipeline demo` in a private folder, waits until the sink is delivered and synced, makes the mirror
reject a few rows (a CHECK constraint), and photographs the lineage, the sink's page and its
no_stale_parked_messages check with Debian's chromium through Playwright (as the browser test drives
it). Then Ctrl-C's the demo, which stops everything it started.

    .venv/bin/python scripts/docs_screenshots.py [--port 3300]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
SINK = ["sink", "orders_mirror"]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:  # not up yet
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def graphql(port: int, query: str) -> dict[str, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["data"]  # type: ignore[no-any-return]


def sink_state(port: int) -> tuple[str, int]:
    """The sink's staleStatus and how many messages its check lists as parked."""
    data = graphql(port, '{ assetNodes(assetKeys: [{path: ["sink", "orders_mirror"]}]) { staleStatus '
                         'assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization '
                         '{ evaluation { metadataEntries { label ... on IntMetadataEntry { intValue } } } } } } } } }')
    node = data["assetNodes"][0]
    parked = 0
    for check in node["assetChecksOrError"]["checks"]:
        execution = check["executionForLatestMaterialization"]
        if check["name"] == "no_stale_parked_messages" and execution and execution["evaluation"]:
            entries = {e["label"]: e.get("intValue") for e in execution["evaluation"]["metadataEntries"]}
            parked = entries.get("parked") or 0
    return node["staleStatus"], parked


def shoot(port: int, config: dict[str, Any]) -> None:
    from playwright.sync_api import sync_playwright

    base = f"http://127.0.0.1:{port}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(120_000)

        def open_(path: str, first: bool = False) -> None:
            page.goto(base + path, wait_until="load")
            with contextlib.suppress(Exception):  # Dagster's newsletter dialog, shown a while after the first page
                page.get_by_role("button", name="Skip").first.click(timeout=20_000 if first else 2000)

        def snap(name: str) -> None:  # once the icons and the figures have arrived (the UI also polls: at most 15 s)
            with contextlib.suppress(Exception):
                page.wait_for_load_state("networkidle", timeout=15_000)
            page.screenshot(path=str(IMAGES / name))

        def settled() -> None:  # the asset graph's "Loading..." rows filled in
            page.wait_for_function("() => !document.body.innerText.includes('Loading')", timeout=120_000)

        open_("/assets/sink/orders_mirror?view=lineage&lineageScope=upstream&lineageDepth=2", first=True)
        page.get_by_text("change_log").first.wait_for()
        settled()
        snap("lineage.png")
        open_("/assets/sink/orders_mirror")
        page.get_by_text("lag_seconds").first.wait_for()
        snap("sink.png")
        mirror = config["sinks"][0]["destination"]["dsn"]
        with psycopg.connect(mirror, autocommit=True) as conn:
            conn.execute("ALTER TABLE mirror.orders ADD CONSTRAINT poison CHECK (status <> 'poison') NOT VALID")
        with psycopg.connect(config["source"]["dsn"], autocommit=True) as conn:
            conn.execute("UPDATE orders SET status = 'poison', updated_at = now() "
                         "WHERE id IN (SELECT id FROM orders ORDER BY id DESC LIMIT 3)")
        wait_until(lambda: sink_state(port)[1] >= 3, 180, "the parked messages in the check")
        open_("/assets/sink/orders_mirror?view=checks")
        page.get_by_text("no_stale_parked_messages").first.click()
        page.get_by_text("parked_messages").first.wait_for()
        snap("failed-messages.png")
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=3300)
    port = parser.parse_args().port
    import yaml

    root = Path(tempfile.mkdtemp(prefix="cdc_screens_"))  # mode 0700, as the demo asks of $CDC_DEMO_DIR
    if os.geteuid() == 0:  # the demo runs its cluster as postgres, as it does in a folder of its own
        os.chown(root, pwd.getpwnam("postgres").pw_uid, -1)
    out = (root / "demo.out").open("wb")
    demo = subprocess.Popen([str(ROOT / ".venv" / "bin" / "cdc-pipeline"), "demo", "--port", str(port)],
                            cwd=ROOT, env=dict(os.environ, CDC_DEMO_DIR=str(root)), stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: sink_state(port)[0] == "FRESH", 600, "the sink delivered and synced")
        config = yaml.safe_load((root / "cdc.yaml").read_text())
        shoot(port, config)
    finally:
        demo.send_signal(signal.SIGINT)  # the demo's own Ctrl-C: runs end Canceled, everything stopped
        demo.wait(300)
        out.close()
        subprocess.run(["rm", "-rf", str(root)], check=False)  # $CDC_DEMO_DIR is ours: the demo keeps it
    print("wrote", *sorted(str(p.relative_to(ROOT)) for p in IMAGES.glob("*.png")))


if __name__ == "__main__":
    main()
