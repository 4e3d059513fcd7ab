"""The Dagster reference: the assets (by kind), checks, jobs, sensors, schedules and resources that
`build_definitions` makes from an example config, with the example's names turned into patterns."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from cdc_pipeline.reference.markdown import code, table

EXAMPLE = """\
source: {dsn: "postgresql://app@db.example/app"}
tables:
  - {name: public.orders, sort_column: updated_at, partitions: {kind: daily, start: "2026-01-01"}}
sinks:
  - name: orders_mirror
    tables: [public.orders]
    destination: {type: postgres, dsn: "postgresql://app@mirror.example/analytics", table: mirror.orders}
  - name: orders_lake
    tables: [public.orders]
    destination: {type: delta, path: /data/lake, mode: mirror}
api_sources:
  - name: crm
    type: rest
    base_url: https://api.example.com
    auth: {type: bearer, token_env: CRM_TOKEN}
    rate_limit: {requests: 10, per_seconds: 1}
    collections: [{name: accounts, table: crm.accounts}]
"""
# The example's names -> the pattern they stand for (longest first, so no name is half replaced).
PATTERNS = (("public/orders", "<schema>/<table>"), ("public_orders", "<schema>_<table>"),
            ("public.orders", "<schema>.<table>"), ("orders_mirror", "<sink>"), ("orders_lake", "<lake sink>"), ("mirror.orders", "<target>"),
            ("crm/accounts", "<source>/<collection>"), ("api_sync_crm", "api_sync_<source>"),
            ("crm.accounts", "<table>"), ("collection accounts", "collection <collection>"),
            ("source crm", "source <source>"), ("rest API", "<type> API"))
# Asset kinds, by the default translator's key shapes: (title, test on the key's path)
KINDS = (
    ("Source tables", lambda p: p[0] == "source"),
    ("Change log", lambda p: p[:2] == ["cdc", "change_log"]),
    ("Snapshots (backfills)", lambda p: p[:2] == ["cdc", "snapshot"]),
    ("Sinks", lambda p: p[0] == "sink"),
    ("API collections", lambda p: p[0] == "api_sync"),
)

INTRO = """\
# Dagster reference

`workspace.yaml` loads `cdc_pipeline.definitions`, which builds everything below from your `cdc.yaml`
(`$CDC_CONFIG`, else `./cdc.yaml`): per table, per sink and per API collection. This page is generated
from what `build_definitions` makes of the example config at the end, with its names written as patterns
(`<schema>/<table>`, `<sink>`, ...). Every asset's key, group, description, kinds and tags come from
`CdcTranslator.get_asset_spec` (`cdc_pipeline/defs/translator.py`): subclass it, or give the component a
`translation`, to rename or regroup ([how](../explanation/dagster.md#renaming-regrouping-annotating-assets)).
How the runs behave: [Dagster](../explanation/dagster.md).

"""


def _pattern(text: str) -> str:
    for example, pattern in PATTERNS:
        text = text.replace(example, pattern)
    return text


def _run_config(assets_def: Any) -> str:
    config_type = assets_def.op.config_schema.config_type if assets_def.op.config_schema else None
    fields = getattr(config_type, "fields", None) or {}
    items = [f"{name}: {'required' if f.is_required else json.dumps(f.default_value if f.default_provided else None)}"
             for name, f in fields.items()]
    return code("{" + ", ".join(items) + "}") if items else ""


def _definitions() -> Any:
    from cdc_pipeline.defs import build_definitions

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cdc.yaml"
        path.write_text(EXAMPLE, encoding="utf-8")
        return build_definitions(str(path))


def render() -> str:
    defs = _definitions()
    repo = defs.get_repository_def()
    graph = repo.asset_graph
    jobs = [j for j in repo.get_all_jobs() if not j.name.startswith("__")]
    job_of: dict[Any, list[str]] = {}
    for job in jobs:
        for key in job.asset_layer.selected_asset_keys:
            job_of.setdefault(key, []).append(job.name)
    nodes = sorted(graph.asset_nodes, key=lambda n: n.key.to_user_string())
    parts = [INTRO, "## Assets by kind\n"]
    shown: set[Any] = set()
    for title, test in KINDS + (("Other assets", lambda p: True),):
        members = [n for n in nodes if n.key not in shown and test(n.key.path)]
        if not members:
            continue
        shown.update(n.key for n in members)
        parts.append(f"\n### {title}\n\n")
        rows = []
        for n in members:
            assets_def = repo.assets_defs_by_key[n.key]
            rows.append([
                code(_pattern(n.key.to_user_string())), n.group_name or "",
                ", ".join(sorted(n.kinds)),
                ", ".join(code(_pattern(p.to_user_string())) for p in sorted(n.parent_keys)) or "-",
                ", ".join(code(_pattern(j)) for j in job_of.get(n.key, [])) or "not materialized here",
                type(n.partitions_def).__name__.removesuffix("PartitionsDefinition") if n.partitions_def else "",
                ", ".join(code(c.name) for c in sorted(n.check_keys, key=lambda c: c.name)),
                _run_config(assets_def) if n.is_materializable else "",
            ])
        parts.append(table(["key", "group", "kinds", "upstream", "job", "partitions", "checks", "run config"], rows))
        parts += [f"\n{code(_pattern(n.key.to_user_string()))}: {_pattern(n.description or '')}\n" for n in members]
    parts.append("\n## Asset checks\n\n")
    checks = sorted({(c.name, _pattern(c.asset_key.to_user_string())): c for c in graph.asset_check_keys}.items())
    parts.append(table(["check", "on", "passes when"], [
        [code(name), code(asset), _pattern(graph.get_check_spec(key).description or "")]
        for (name, asset), key in checks]))
    parts.append("\n## Jobs\n\n")
    parts.append(table(["job", "materializes", "tags", "what"], [
        [code(_pattern(j.name)),
         ", ".join(code(_pattern(k.to_user_string())) for k in sorted(j.asset_layer.selected_asset_keys)) or "-",
         ", ".join(code(_pattern(f"{k}: {v}")) for k, v in sorted(j.tags.items())), _pattern(j.description or "")]
        for j in jobs]))
    parts.append("\n## Sensors\n\n")
    parts.append(table(["sensor", "default", "minimum interval", "starts", "what"], [
        [code(s.name), s.default_status.value.lower(), f"{s.minimum_interval_seconds} s",
         ", ".join(code(_pattern(t.job_name)) for t in s.targets), s.description or ""]
        for s in repo.sensor_defs]))
    parts.append("\n## Schedules\n\n")
    parts.append(table(["schedule", "cron", "default", "job", "what"], [
        [code(_pattern(s.name)), code(f"{s.cron_schedule}") + f" {s.execution_timezone or 'UTC'}",
         s.default_status.value.lower(), code(_pattern(s.job_name)), _pattern(s.description or "")]
        for s in repo.schedule_defs]))
    parts.append("\n## Resources\n\n")
    parts.append(table(["resource", "class", "what"], [
        [code(name), code(type(res).__name__), (type(res).__doc__ or "").strip().split("\n\n")[0]]
        for name, res in sorted((defs.resources or {}).items())]))
    parts.append(f"\n## The example config\n\n```yaml\n{EXAMPLE}```\n")
    return "".join(parts)
