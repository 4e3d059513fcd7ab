"""`api-sync`: backfill and keep syncing API sources into Postgres tables."""

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


@click.command(cls=Verb, short_help="backfill and keep syncing API sources into Postgres tables", epilog=examples(
    "cdc-pipeline api-sync                         # every API source, until SIGTERM/SIGINT/SIGHUP",
    "cdc-pipeline api-sync --source tickets --until-idle",
    "cdc-pipeline api-sync --metrics-port 9110         # /metrics, /healthz, /readyz"))
@config_option
@click.option("--source", help="one API source (default: all)")
@until_options("every collection has caught up")
@metrics_option
@click.pass_context
def api_sync(ctx: click.Context, source: str | None, until_idle: bool, seconds: float | None,
             metrics_port: int | None) -> int:
    """Backfill API sources' collections into Postgres tables, then keep them in sync; resumes from the
    checkpoint after a restart."""
    stop_on_signals()  # before the slow part: a signal during start-up is a clean stop
    from cdc_pipeline.api_sync.loop import ApiSync
    from cdc_pipeline.ops.health import start_ops

    config = load(ctx)
    sync = ApiSync(config, source=source)
    stop_on_signals(sync.stop)
    # Not ready while a source's requests fail (retried, or its collections cooling down).
    ops = start_ops(config, metrics_port, lambda: list(sync.syncs),
                    [lambda: "; ".join(r for s in sync.syncs for r in s.outages()) or None])
    try:
        results = sync.run(until_idle=until_idle, seconds=seconds)
    finally:
        if ops is not None:
            ops.stop()
    for name, stats in results.items():
        print(f"api source {name}: {stats.records} records written, {stats.deleted} deleted, "
              f"{stats.requests} requests in {stats.seconds:.1f} s ({', '.join(stats.collections) or 'no collections'})")
    return 0
