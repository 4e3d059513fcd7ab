"""Administration verbs over a pipeline: `setup` (setup.py), `check` (check.py) and `status` (status.py).
What they say about one sink's destination each sink type declares itself (sinks/base.py)."""
