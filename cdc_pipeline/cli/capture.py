"""`drain`: stream the replication slot into the change log."""

from __future__ import annotations

import click

from cdc_pipeline.cli.common import (
    Verb,
    config_option,
    examples,
    load,
    metrics_option,
    stop_on_signals,
    until_options,
)


@click.command(cls=Verb, short_help="stream the replication slot into the change log", epilog=examples(
    "cdc-pipeline drain                          # until SIGTERM/SIGINT/SIGHUP",
    "cdc-pipeline drain --until-idle             # stop once caught up with the source",
    "cdc-pipeline drain --seconds 300"))
@config_option
@until_options("caught up with the source")
@metrics_option
@click.pass_context
def drain(ctx: click.Context, until_idle: bool, seconds: float | None, metrics_port: int | None) -> int:
    """Stream the replication slot into the change log, acknowledging the slot only after the log commits.
    Rides through lost connections and restarts; runs until stopped unless given --until-idle or --seconds."""
    stop_on_signals()  # before the slow part: a signal during start-up is a clean stop
    from cdc_pipeline.capture.drain import Drain
    from cdc_pipeline.ops.health import start_ops
    from cdc_pipeline.ops.readiness import drain_streaming

    config = load(ctx)
    runner = Drain(config)
    stop_on_signals(runner.stop)
    ops = start_ops(config, metrics_port, lambda: [runner], [drain_streaming(runner)])
    try:
        stats = runner.run(seconds=seconds, until_idle=until_idle)
    finally:
        if ops is not None:
            ops.stop()
    print(f"drained {stats.changes} changes in {stats.transactions} transactions in {stats.seconds:.1f} s "
          f"({stats.rate:.0f} changes/s); confirmed LSN {stats.committed_lsn}; {stats.sessions} replication "
          f"sessions, {stats.retries} retries")
    return 0
