"""`cdc-pipeline demo`: the embedded demo (run.py) and the `dagster dev` wrapper it starts (dagster_dev.py)."""
