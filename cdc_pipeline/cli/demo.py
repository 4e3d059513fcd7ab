"""`demo`: embedded Postgres, a sample write load, the pipeline and the Dagster UI."""

from __future__ import annotations

import click

from cdc_pipeline.cli.common import Verb, config_option, examples, stop_on_signals


@click.command(cls=Verb, short_help="embedded Postgres + sample load + pipeline + Dagster UI", epilog=examples(
    "cdc-pipeline demo                            # UI on http://127.0.0.1:3000 until Ctrl-C",
    "cdc-pipeline demo --no-ui --seconds 60",
    "cdc-pipeline demo --keep                     # keep its folder (cluster, config, Dagster's storage)"))
@config_option  # accepted like every verb's; the demo writes its own config
@click.option("--port", type=int, default=3000, show_default=True, help="Dagster UI port")
@click.option("--seconds", type=float, default=None, help="stop after this long (default: until Ctrl-C)")
@click.option("--no-ui", is_flag=True, help="run the pipeline without the Dagster UI")
@click.option("--keep", is_flag=True, help="keep the demo's temporary folder at exit (default: removed)")
def demo(port: int, seconds: float | None, no_ui: bool, keep: bool) -> int:
    """Start a throwaway PostgreSQL cluster with sample tables and a steady write load, set up the
    pipeline and run it, with the Dagster UI unless --no-ui."""
    stop_on_signals()  # Ctrl-C, SIGTERM or a closing terminal stop everything it started; twice forces
    from cdc_pipeline.demo.run import run_demo

    return run_demo(port=port, seconds=seconds, ui=not no_ui, keep=keep)
