"""Administration verbs over a pipeline: `setup` (setup.py), `check` (check.py), `status` (status.py) and the
Postgres sinks' grants that `check` reports (grants.py)."""
