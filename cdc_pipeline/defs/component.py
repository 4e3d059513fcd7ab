"""The pipeline as a Dagster component: a `defs.yaml` in a `dg` project's defs folder

    type: cdc_pipeline.defs.component.CdcPipelineComponent
    attributes:
      config: cdc.yaml        # relative to the folder holding defs.yaml (or absolute)
      translation:            # optional: per-asset attributes, templated over the asset's record
        key_prefix: acme
        group_name: "acme_{{ data.kind }}"
    post_processing:          # optional: Dagster's own, applied to the built assets
      assets:
        - target: "group:acme_sink"
          attributes: {owners: ["team:data"]}

builds the same definitions as `workspace.yaml` does through `cdc_pipeline.definitions`. `translation`
is applied inside `CdcTranslator.get_asset_spec`, so it may rename keys (deps follow); its templates
see `data` (a record of defs/asset_data.py: `data.kind`, `data.name`, ...) and `spec` (the default spec).
"""

# No `from __future__ import annotations`: Resolvable reads the field types at runtime.
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from dagster.components.utils.translation import ResolvedTranslationFn, TranslationFn

from cdc_pipeline.defs import build_definitions
from cdc_pipeline.defs.asset_data import AssetData
from cdc_pipeline.defs.translator import CdcTranslator


class TranslatedCdcTranslator(CdcTranslator):
    """The default translator, then the component's `translation` on each spec: upstream keys are
    asked of this translator too, so a translated key stays connected."""

    def __init__(self, translation: TranslationFn[AssetData]) -> None:
        self.translation = translation

    def get_asset_spec(self, data: AssetData) -> dg.AssetSpec:
        return self.translation(super().get_asset_spec(data), data)


@dataclass
class CdcPipelineComponent(dg.Component, dg.Resolvable):
    """Source tables, change log, sinks, backfills and API collections (assets, checks, jobs, sensors)
    from a cdc.yaml."""

    config: str = "cdc.yaml"
    translation: ResolvedTranslationFn[AssetData] = None

    def translator(self) -> CdcTranslator:
        return CdcTranslator() if self.translation is None else TranslatedCdcTranslator(self.translation)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        path = Path(self.config)
        if not path.is_absolute():
            path = Path(context.path) / path
        return build_definitions(str(path.resolve()), self.translator())
