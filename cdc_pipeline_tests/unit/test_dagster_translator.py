"""`CdcTranslator.get_asset_spec` is the one override point of the Dagster assets: a subclass that
renames and regroups every kind of asset gets a graph with only its keys, the same lineage, and checks,
jobs and sensors on the renamed keys; the YAML component's `translation` goes through the same point and
Dagster's own `post_processing` applies on top. No database: building definitions only reads the config."""

from __future__ import annotations

from pathlib import Path

import yaml
from dagster import AssetKey, AssetSpec

from cdc_pipeline.defs import build_definitions
from cdc_pipeline.defs.asset_data import AssetData
from cdc_pipeline.defs.tags import KIND_TAG
from cdc_pipeline.defs.translator import CdcTranslator

CONFIG = {
    "source": {"dsn": "postgresql://app@db.example/app"},
    "tables": [{"name": "public.orders", "sort_column": "updated_at",
                "partitions": {"kind": "daily", "start": "2026-01-01"}}, {"name": "public.customers"}],
    "sinks": [
        {"name": "mirror", "tables": ["public.orders", "public.customers"],
         "destination": {"type": "postgres", "dsn": "postgresql://app@mirror.example/a", "table": "mirror.{table}"}},
        {"name": "hook", "tables": ["public.orders"],
         "destination": {"type": "webhook", "url": "http://127.0.0.1:9/x"}},
    ],
    "api_sources": [{"name": "crm", "type": "rest", "base_url": "https://api.example.com",
                     "auth": {"type": "bearer", "token_env": "CRM_TOKEN"},
                     "rate_limit": {"requests": 10, "per_seconds": 1},
                     "collections": [{"name": "accounts", "table": "crm.accounts"}]}],
}


def acme(kind: str, *path: str) -> AssetKey:
    return AssetKey(["acme", kind, *path])


class RenamingTranslator(CdcTranslator):
    """Every asset under acme/<kind>/<its name's parts>, in group acme_<kind>, owned by team:acme."""

    def get_asset_spec(self, data: AssetData) -> AssetSpec:
        spec = super().get_asset_spec(data)
        return spec.replace_attributes(
            key=acme(data.kind, *data.name.split(".")), group_name=f"acme_{data.kind}", owners=["team:acme"],
            description=f"acme: {spec.description}",
        ).merge_attributes(tags={"acme": data.kind}, metadata={"acme/kind": data.kind})


SOURCE_ORDERS, SOURCE_CUSTOMERS = acme("source_table", "public", "orders"), acme("source_table", "public", "customers")
LOG = acme("change_log", "change_log")
SNAP_ORDERS, SNAP_CUSTOMERS = acme("snapshot", "public", "orders"), acme("snapshot", "public", "customers")
MIRROR, HOOK = acme("sink", "mirror"), acme("sink", "hook")
ACCOUNTS = acme("api_collection", "crm", "accounts")


def write_config(tmp_path: Path) -> str:
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    return str(path)


def test_a_subclass_renames_and_regroups_every_asset_and_keeps_the_lineage(tmp_path: Path) -> None:
    defs = build_definitions(write_config(tmp_path), RenamingTranslator())
    graph = defs.resolve_asset_graph()
    assert set(graph.get_all_asset_keys()) == {SOURCE_ORDERS, SOURCE_CUSTOMERS, LOG, SNAP_ORDERS, SNAP_CUSTOMERS,
                                               MIRROR, HOOK, ACCOUNTS}
    assert graph.get(LOG).parent_keys == {SOURCE_ORDERS, SOURCE_CUSTOMERS}
    assert graph.get(SNAP_ORDERS).parent_keys == {SOURCE_ORDERS}
    assert graph.get(SNAP_CUSTOMERS).parent_keys == {SOURCE_CUSTOMERS}
    assert graph.get(MIRROR).parent_keys == {LOG, SNAP_ORDERS, SNAP_CUSTOMERS}
    assert graph.get(HOOK).parent_keys == {LOG, SNAP_ORDERS}
    assert graph.get(ACCOUNTS).parent_keys == set()
    assert graph.get(SNAP_ORDERS).partitions_def is not None
    for node in graph.asset_nodes:
        kind = node.key.path[1]
        assert node.group_name == f"acme_{kind}" and node.owners == ["team:acme"], node.key
        assert node.tags["acme"] == kind and node.metadata["acme/kind"] == kind, node.key
        assert node.description.startswith("acme: "), node.key
    # What the default spec said is kept where the subclass did not change it.
    assert graph.get(MIRROR).kinds == {"spark", "postgres"} and graph.get(MIRROR).tags[KIND_TAG] == "delivery"
    assert graph.get(SOURCE_ORDERS).metadata["dagster/table_name"] == "public.orders"
    assert not graph.get(SOURCE_ORDERS).is_materializable
    # Checks and jobs are on the renamed keys.
    checks = {(c.asset_key, c.name) for c in graph.asset_check_keys}
    assert {(LOG, "slot_lag_below_max"), (MIRROR, "lag_below_max"), (HOOK, "no_stale_parked_messages"),
            (SNAP_ORDERS, "backfill_completed"), (ACCOUNTS, "max_lag_within_ceiling")} <= checks
    assert {c[0] for c in checks} <= set(graph.get_all_asset_keys())
    selected = {job: defs.resolve_job_def(job).asset_layer.selected_asset_keys
                for job in ("cdc_drain", "deliver_mirror", "deliver_hook", "backfill_public_orders", "api_sync_crm")}
    assert selected == {"cdc_drain": {LOG}, "deliver_mirror": {MIRROR}, "deliver_hook": {HOOK},
                        "backfill_public_orders": {SNAP_ORDERS}, "api_sync_crm": {ACCOUNTS}}


def test_the_default_translator_keys_and_groups(tmp_path: Path) -> None:
    graph = build_definitions(write_config(tmp_path)).resolve_asset_graph()
    groups = {n.key.to_user_string(): n.group_name for n in graph.asset_nodes}
    assert groups == {
        "source/public/orders": "source", "source/public/customers": "source",
        "cdc/change_log": "cdc", "cdc/snapshot/public/orders_snapshot": "cdc", "cdc/snapshot/public/customers_snapshot": "cdc",
        "sink/mirror": "sink", "sink/hook": "sink", "api_sync/crm/accounts": "api_sync"}


def test_the_component_applies_translation_and_post_processing(tmp_path: Path) -> None:
    from dagster.components.testing import create_defs_folder_sandbox

    from cdc_pipeline.defs.component import CdcPipelineComponent

    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(component_cls=CdcPipelineComponent, defs_yaml_contents={
            "type": "cdc_pipeline.defs.component.CdcPipelineComponent",
            "attributes": {"config": "cdc.yaml", "translation": {
                "key_prefix": "acme", "group_name": "acme_{{ data.kind }}",
                "tags": {"origin": "{{ data.name }}"}, "description": "{{ spec.description }} (acme)"}},
            "post_processing": {"assets": [{"target": "group:acme_sink", "attributes": {"owners": ["team:data"]}}]}})
        (path / "cdc.yaml").write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            assert isinstance(component, CdcPipelineComponent)
            graph = defs.resolve_asset_graph()
            log, mirror = AssetKey(["acme", "cdc", "change_log"]), AssetKey(["acme", "sink", "mirror"])
            assert all(k.path[0] == "acme" for k in graph.get_all_asset_keys())
            assert graph.get(mirror).parent_keys == {log, AssetKey(["acme", "cdc", "snapshot", "public", "orders_snapshot"]),
                                                     AssetKey(["acme", "cdc", "snapshot", "public", "customers_snapshot"])}
            assert graph.get(log).parent_keys == {AssetKey(["acme", "source", "public", t])
                                                  for t in ("orders", "customers")}
            assert graph.get(mirror).group_name == "acme_sink" and graph.get(log).group_name == "acme_change_log"
            assert graph.get(mirror).tags["origin"] == "mirror"
            assert graph.get(AssetKey(["acme", "api_sync", "crm", "accounts"])).tags["origin"] == "crm.accounts"
            assert graph.get(mirror).description.endswith("(acme)") and "sink mirror" in graph.get(mirror).description
            assert graph.get(mirror).owners == ["team:data"] and graph.get(log).owners == []
            assert defs.resolve_job_def("deliver_mirror").asset_layer.selected_asset_keys == {mirror}
