"""The pipeline as a Dagster component: a `defs.yaml` in a `dg` project's defs folder

    type: cdc_pipeline.defs.component.CdcPipelineComponent
    attributes:
      config: cdc.yaml        # relative to the folder holding defs.yaml (or absolute)

builds the same definitions as `workspace.yaml` does through `cdc_pipeline.definitions`.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from cdc_pipeline.defs import build_definitions


class CdcPipelineComponent(dg.Component, dg.Model, dg.Resolvable):
    """Source tables, change log, sinks and backfills (assets, checks, jobs, sensors) from a cdc.yaml."""

    config: str = "cdc.yaml"

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        path = Path(self.config)
        if not path.is_absolute():
            path = Path(context.path) / path
        return build_definitions(str(path.resolve()))
