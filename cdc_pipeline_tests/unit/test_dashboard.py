"""The Grafana dashboard (deploy/grafana-dashboard.json) and the alert rules in the docs query only metrics
the code exports and the operations page documents: a renamed metric cannot leave a panel empty."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bcdc_[a-z_]+")
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def _base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _exported() -> set[str]:
    """Metric names as the code writes them; `cdc_sink_messages_{name}` expanded over its names."""
    names: set[str] = set()
    for path in (ROOT / "cdc_pipeline").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        names |= set(re.findall(r"[(\s]\"(cdc_[a-z_]+)\"", text))
        for prefix, options in re.findall(r"f\"(cdc_[a-z_]+)\{name\}\"(?:[^\n]*\n){0,3}?[^\n]*for name in \(([^)]*)\)", text):
            names |= {prefix + o.strip().strip('"') for o in options.split(",")}
    return names


def _documented() -> str:
    """The operations page, with `cdc_x_{a,b}_total` spelt out as `cdc_x_a_total cdc_x_b_total`."""
    text = (ROOT / "docs/explanation/operations.md").read_text(encoding="utf-8")
    return re.sub(r"(cdc_[a-z_]+)\{([a-z_,]+)\}([a-z_]*)",
                  lambda m: " ".join(m[1] + o + m[3] for o in m[2].split(",")), text)


def test_every_dashboard_metric_is_exported_and_documented() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana-dashboard.json").read_text(encoding="utf-8"))
    used = {_base(n) for panel in dashboard["panels"] for t in panel.get("targets", [])
            for n in NAME.findall(t["expr"])}
    documented = _documented()
    exported = _exported()
    assert "cdc_sink_messages_delivered" in exported and "cdc_sink_lag_seconds" in exported  # the scan works
    assert used - exported == set(), "dashboard metrics the code does not export"
    assert {n for n in used if n not in documented} == set(), "dashboard metrics the docs do not list"


def test_the_readme_and_docs_alert_rules_use_exported_metrics() -> None:
    exported = _exported()
    for page in ("README.md", "docs/explanation/operations.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        exprs = re.findall(r"expr: (.*)", text)
        assert exprs, page
        used = {_base(n) for e in exprs for n in NAME.findall(e)}
        assert used - exported == set(), f"{page}: alert rules on metrics the code does not export"
