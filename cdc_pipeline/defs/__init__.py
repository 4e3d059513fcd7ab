"""Dagster definitions built from a pipeline config: each area (capture, delivery, failed messages, lake
maintenance, backfill, API sync, replay, resources) makes its own `Definitions`, merged here.

The asset graph is the data's lineage: source tables (``source/<schema>/<table>``, specs only) ->
``cdc/change_log`` (materialized by the long-lived drain run) -> ``sink/<name>`` (each materialized by
its long-lived delivery run); a table's backfill is ``cdc/snapshot/<schema>/<table>_snapshot``, downstream of
its source table and upstream of the sinks that receive it. Every asset's spec (key, group, ...) comes
from a `CdcTranslator`.
"""

from __future__ import annotations

from dagster import Definitions

from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.defs.api_sync import api_sync_definitions
from cdc_pipeline.defs.backfill import backfill_definitions
from cdc_pipeline.defs.capture import capture_definitions
from cdc_pipeline.defs.delivery import delivery_definitions
from cdc_pipeline.defs.delivery_run import DeliveryResource
from cdc_pipeline.defs.drain_run import DrainResource
from cdc_pipeline.defs.failed import failed_definitions
from cdc_pipeline.defs.lake import lake_definitions
from cdc_pipeline.defs.replay import replay_definitions
from cdc_pipeline.defs.resources import CdcConfigResource, SinksResource, pyspark_resource
from cdc_pipeline.defs.translator import CdcTranslator


def build_definitions(path: str, translator: CdcTranslator | None = None) -> Definitions:
    translator = translator or CdcTranslator()
    pipeline = load_config(path)
    pipeline.check_dsns()
    return Definitions.merge(
        capture_definitions(pipeline, translator),
        delivery_definitions(pipeline, translator),
        failed_definitions(pipeline),  # jobs only: no assets to translate
        lake_definitions(pipeline, translator),
        backfill_definitions(pipeline, translator),
        api_sync_definitions(pipeline, translator),
        replay_definitions(),
        resource_definitions(pipeline),
    )


def resource_definitions(config: PipelineConfig) -> Definitions:
    """`cdc` (the config), `pyspark` (the Spark session) and `sinks`: what every area's assets and ops use;
    `drain` and `delivery`, built on them, run the streaming assets."""
    assert config.path is not None, "the Dagster code location loads its config from a file"
    cdc, pyspark = CdcConfigResource(config_path=config.path), pyspark_resource(config)
    sinks = SinksResource(config_path=config.path)
    return Definitions(resources={"cdc": cdc, "pyspark": pyspark, "sinks": sinks, "drain": DrainResource(cdc=cdc),
                                  "delivery": DeliveryResource(cdc=cdc, pyspark=pyspark, sinks=sinks)})
