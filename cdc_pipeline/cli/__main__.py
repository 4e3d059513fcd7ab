"""`python -m cdc_pipeline.cli`: the same as the `cdc-pipeline` console script."""

import sys

from cdc_pipeline.cli import main

sys.exit(main())
