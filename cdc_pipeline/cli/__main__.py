"""`python -m cdc_pipeline.cli`: the same as the `cdc-pipeline` console script."""

from cdc_pipeline.cli import run

run()
