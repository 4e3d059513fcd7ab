"""`deliver` and `failed`: send the change log to sinks, and manage the messages parked on the way."""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import TYPE_CHECKING

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
from cdc_pipeline.config import ConfigError, PipelineConfig, SinkConfig
from cdc_pipeline.postgres import session

if TYPE_CHECKING:  # the delivery engine loads only when a verb runs
    from cdc_pipeline.delivery.engine import Deliverer
    from cdc_pipeline.delivery.lazy_spark import LazySpark
    from cdc_pipeline.delivery.stats import DeliveryStats


@click.command(cls=Verb, short_help="deliver the change log to sinks", epilog=examples(
    "cdc-pipeline deliver                                  # every sink at once, until SIGTERM/SIGINT/SIGHUP",
    "cdc-pipeline deliver --sink orders_mirror --until-idle",
    "cdc-pipeline deliver --sink hook --lane 1              # one lane of a sink with `lanes: N`",
    "cdc-pipeline deliver --sink hook --dry-run --output messages.jsonl"))
@config_option
@click.option("--sink", help="one sink (default: all, at once)")
@click.option("--lane", type=click.IntRange(min=0), default=None,
              help="with --sink: one lane of a sink with `lanes: N` (0 to N-1; default: every lane, at once)")
@until_options("the sink has caught up")
@click.option("--dry-run", is_flag=True, help="print what would be sent; touch nothing")
@click.option("--output", metavar="FILE", help="with --dry-run: write the messages (JSON lines) to this file")
@metrics_option
@click.pass_context
def deliver(ctx: click.Context, sink: str | None, lane: int | None, until_idle: bool, seconds: float | None,
            dry_run: bool, output: str | None, metrics_port: int | None) -> int:
    """Deliver the change log to sinks through Spark (filter, transform, route), in commit order per
    group; failed messages are parked and retried. Without --sink every sink is delivered at once, each
    by its own deliverer in this process; Spark starts only when a sink's stage needs it. A dry run prints
    what is waiting now and stops. A sink with `lanes: N` is delivered by N deliverers (its lanes), or only
    by lane --lane."""
    shutdown = stop_on_signals()  # before the slow part: a signal during start-up is a clean stop
    from cdc_pipeline.delivery.dry_run import DryRun
    from cdc_pipeline.delivery.engine import Deliverer
    from cdc_pipeline.delivery.lazy_spark import LazySpark
    from cdc_pipeline.delivery.pandas_free import prepare_arrow
    from cdc_pipeline.delivery.plan import SinkPlan
    from cdc_pipeline.ops.health import start_ops
    from cdc_pipeline.ops.readiness import deliverers_not_waiting

    config = load(ctx)
    lanes = _lanes(config, sink, lane)
    prepare_arrow(needs_spark=any(SinkPlan.build(config, one).needs_record for one, _ in lanes))
    spark = LazySpark(config.spark)
    out = open(output, "w") if output else sys.stdout  # noqa: SIM115 - closed below
    ops = None
    try:
        deliverers = [DryRun(config, one, spark, out, lane=i) if dry_run else Deliverer(config, one, spark, lane=i)
                      for one, i in lanes]
        for deliverer in deliverers:
            shutdown.on_stop(deliverer.stop)
        ops = None if dry_run else start_ops(config, metrics_port, lambda: list(deliverers),
                                             [deliverers_not_waiting(lambda: deliverers)])
        # A dry run shows what is waiting now; it does not wait for more unless given --seconds.
        once = until_idle or (dry_run and seconds is None)
        for stats in _run(deliverers, dry_run, once, seconds, shutdown.requested, spark):
            print(f"sink {stats.sink}: " + json.dumps(stats.as_metadata()), file=sys.stderr if dry_run else sys.stdout)
    finally:
        if ops is not None:
            ops.stop()
        if out is not sys.stdout:
            out.close()
    return 0


def _lanes(config: PipelineConfig, sink: str | None, lane: int | None) -> list[tuple[SinkConfig, int]]:
    """What `deliver` runs a deliverer for: (sink, lane) of every lane of every sink, of --sink, or --lane."""
    sinks = [config.sink(sink)] if sink else list(config.sinks)
    if not sinks:
        raise ConfigError(f"{config.path}: no sinks configured")
    if lane is not None and (sink is None or lane >= sinks[0].lanes):
        raise ConfigError(f"--lane {lane}: " + ("give --sink too" if sink is None else
                          f"sink {sink!r} has lanes 0 to {sinks[0].lanes - 1} (`lanes: {sinks[0].lanes}`)"))
    return [(one, i) for one in sinks for i in ([lane] if lane is not None else range(one.lanes))]


def _run(deliverers: list[Deliverer], dry_run: bool, once: bool, seconds: float | None,
         stopping: threading.Event, spark: LazySpark) -> list[DeliveryStats]:
    """Each deliverer's run: a dry run's one after the other (their messages must not interleave in the
    output), else all at once, each in its thread."""
    from cdc_pipeline.delivery.together import Abandoned, run_together
    from cdc_pipeline.ops.signals import kill_descendants

    if dry_run:
        return [d.run(until_idle=once, seconds=seconds) for d in deliverers]
    try:
        return run_together(deliverers, lambda d: d.run(until_idle=once, seconds=seconds),
                            [d.lane.name for d in deliverers], stopping, lambda alive: spark.waiting >= alive)
    except Abandoned as left:
        # Only Spark's start-up is left: nothing was sent yet, so stopping now loses nothing.
        print(f"stopped while Spark was starting for sink(s) {left}: nothing in flight", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        kill_descendants()
        os._exit(0)


@click.command(cls=Verb, short_help="list, retry or discard parked messages", epilog=examples(
    "cdc-pipeline failed list [--sink S] [--json]",
    "cdc-pipeline failed retry 24681234:3        # one message, due for retry now",
    "cdc-pipeline failed retry --all --sink hook  # parked ones only",
    "cdc-pipeline failed retry --all --include-discarded   # discarded too (warns)",
    "cdc-pipeline failed discard --all"))
@config_option
@click.argument("action", type=click.Choice(["list", "retry", "discard"]))
@click.argument("message_id", metavar="[ID]", required=False)
@click.option("--all", "every", is_flag=True, help="retry/discard every parked message (of --sink)")
@click.option("--include-discarded", is_flag=True,
              help="with retry --all: revive discarded messages too (warns: they arrive after newer versions)")
@click.option("--sink", help="only this sink")
@click.option("--json", "as_json", is_flag=True, help="list: JSON output")
@click.pass_context
def failed(ctx: click.Context, action: str, message_id: str | None, every: bool, include_discarded: bool,
           sink: str | None, as_json: bool) -> int:
    """List, retry or discard parked messages. ID is a message's commit_lsn:commit_idx (from `failed list`).
    Retry/discard exit 1 when no message matched an ID. An http_pull sink's parked message (max_deliveries)
    is available to consumers again after retry; discard deletes it from the queue."""

    from cdc_pipeline.state.failed_messages import FailedMessages
    from cdc_pipeline.state.pull_queue import PullQueue

    config = load(ctx)
    if sink:
        config.sink(sink)  # unknown sink: a clear error
    failed_messages = FailedMessages(config.state.schema_name)
    pull = PullQueue(config.state.schema_name)  # http_pull sinks park in their queue
    with session.connect(config.state_dsn) as conn:
        if action == "list":
            items = sorted(failed_messages.list_failed(conn, sink) + pull.list_parked(conn, sink),
                           key=lambda it: (it["sink"], it["commit_lsn"], it["commit_idx"]))
            if as_json:
                print(json.dumps(items, indent=2, default=str))
            for it in [] if as_json else items:
                due = f"{it['next_attempt_at']:%Y-%m-%d %H:%M:%S}" if it["next_attempt_at"] else "on retry"
                print(f"{it['sink']} {it['id']} group={it['group_key']} {it['status']} attempts={it['attempts']} "
                      f"next={due} error={it['last_error']}")
            if not items and not as_json:
                print("no failed messages")
            return 0
        if not every and not message_id:
            raise ConfigError(f"failed {action}: give a message ID (from `failed list`) or --all")
        position = None
        if message_id:
            lsn, _, idx = message_id.partition(":")
            if not (lsn.isdigit() and idx.lstrip("-").isdigit()):
                raise ConfigError(f"failed {action}: {message_id!r} is not a message ID like 24681234:3")
            position = (int(lsn), int(idx))
        if action == "retry":
            # A message named by ID is revived whatever its status; --all revives parked ones only.
            n, revived = failed_messages.retry_now(conn, sink, position, include_discarded or position is not None)
            n += pull.unpark(conn, sink, position)
        else:
            n, revived = failed_messages.discard_now(conn, sink, position) + len(pull.drop_parked(conn, sink, position)), 0
        conn.commit()
    if revived:
        print(f"warning: {revived} discarded message(s) revived: each is delivered after the newer versions of "
              "its row delivered since it was discarded (in a mirror, a stale overwrite until the row changes "
              "again)", file=sys.stderr)
    verb = "due for retry now" if action == "retry" else "discarded"
    print(f"{n} message(s) {verb}")
    return 0 if n or every else 1
