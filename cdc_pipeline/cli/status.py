"""`status`: slot lag, log, sink offsets and lag, failed messages, backfills."""

from __future__ import annotations

import json

import click

from cdc_pipeline.cli.common import Verb, config_option, examples, load


@click.command(cls=Verb, short_help="slot lag, log, sink offsets, failed messages", epilog=examples(
    "cdc-pipeline status", "cdc-pipeline status --json"))
@config_option
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> int:
    """Slot lag and whether a drain consumes it, log size, sink offsets and lag, parked and discarded
    messages, backfills and their checkpoints."""
    from cdc_pipeline.admin import status as report

    data = report.collect(load(ctx))
    print(json.dumps(data, indent=2, default=str) if as_json else report.render(data))
    return 0
