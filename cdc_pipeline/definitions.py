"""The Dagster code location: `workspace.yaml` loads `defs` from here.

The pipeline config is read from $CDC_CONFIG (or ./cdc.yaml); every table and sink in it becomes
assets, jobs and sensors (see cdc_pipeline/defs/).
"""

from __future__ import annotations

import os
from pathlib import Path

from cdc_pipeline.config import CONFIG_ENV_VAR, ConfigError
from cdc_pipeline.defs import build_definitions


def config_path() -> str:
    path = os.environ.get(CONFIG_ENV_VAR) or ("cdc.yaml" if Path("cdc.yaml").exists() else None)
    if path is None:
        raise ConfigError(f"no pipeline config: set {CONFIG_ENV_VAR} to the path of your cdc.yaml")
    return str(Path(path).resolve())


defs = build_definitions(config_path())
