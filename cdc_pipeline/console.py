"""The `cdc-pipeline` console script's entry: the signal handlers first, then the command line.

Python's imports take 0.1-0.9 s before a verb runs; a SIGTERM, SIGINT or SIGHUP in that time would kill
the process (status 143/130/129: a service manager that stops a just-started unit records a failure). So
the handlers (ops/signals.py, standard library only) are set before anything else is imported: a signal
then is a clean stop of a long-running verb, which sees it as it starts; a short verb gets the previous
handling back as it starts (cli/__init__.py).
"""

from __future__ import annotations

from typing import NoReturn


def run() -> NoReturn:
    from cdc_pipeline.ops.signals import shutdown

    shutdown.install()
    from cdc_pipeline.cli import run as run_cli

    run_cli()
