"""`serve` and `replay`: the HTTP API of pull consumers, and re-delivering a commit-time window to one sink."""

from __future__ import annotations

import json
import logging

import click

from cdc_pipeline.cli.common import Verb, config_option, examples, load, metrics_option, stop_on_signals


@click.command(cls=Verb, short_help="HTTP API for pull consumers (http_pull sinks)", epilog=examples(
    "PULL_TOKEN=... cdc-pipeline serve                      # 127.0.0.1:8080",
    "cdc-pipeline serve --host 0.0.0.0 --port 9000 --metrics-port 9108"))
@config_option
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", type=int, default=8080, show_default=True, help="port to listen on")
@metrics_option
@click.pass_context
def serve(ctx: click.Context, host: str, port: int, metrics_port: int | None) -> int:
    """Serve the receive/ack/nack API of every http_pull sink (OpenAPI at /openapi.json) until
    SIGTERM/SIGINT/SIGHUP; several servers may share one state database."""
    stop_on_signals()  # before the slow part: a signal during start-up is a clean stop
    from cdc_pipeline.consumers.serve import server as build_server
    from cdc_pipeline.ops.health import start_ops, state_reachable

    logging.getLogger("cdc_pipeline").setLevel(logging.INFO)  # a server says what it serves and waits for
    config = load(ctx)
    http = build_server(config, host=host, port=port)
    # Ready once it accepts and while the state database answers: every request is a statement there.
    ops = start_ops(config, metrics_port, list, [lambda: None if http.started else "serve: starting",
                                                 state_reachable(config)], status_ready=False)
    try:
        http.run()
        return 0
    finally:
        if ops is not None:
            ops.stop()


@click.command(cls=Verb, short_help="re-deliver a commit-time window of the log to one sink", epilog=examples(
    "cdc-pipeline replay --sink audit --from 2026-11-20T09:00 --to 2026-11-20T09:30",
    "cdc-pipeline replay --sink audit --from '2026-11-20 09:00+01:00' --table public.orders"))
@config_option
@click.option("--sink", required=True, help="the sink to replay to (others are untouched)")
@click.option("--from", "start", required=True, help="window start (ISO 8601; UTC if no zone)")
@click.option("--to", "end", default=None, help="window end, exclusive (default: now)")
@click.option("--table", default=None, help="only this table's changes")
@click.pass_context
def replay(ctx: click.Context, sink: str, start: str, end: str | None, table: str | None) -> int:
    """Re-deliver the retained changes committed in [--from, --to) to one sink: the same messages and
    idempotency keys, in commit order; the sink's offset is left where it was."""
    from cdc_pipeline.delivery.replay import parse_time
    from cdc_pipeline.delivery.replay import replay as run_replay

    stats = run_replay(load(ctx), sink, parse_time(start), parse_time(end) if end else None, table=table)
    print(f"replay to sink {sink}: " + json.dumps(stats.as_metadata()))
    return 1 if stats.failed else 0
