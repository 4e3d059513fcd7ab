"""`backfill`: run a backfill in the foreground, or list / pause / resume / cancel backfills.

`backfill TARGET [ID]` keeps its one-verb form (a contract): TARGET is a table, or one of MANAGE.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import click

from cdc_pipeline.cli.common import Verb, config_option, examples, load, metrics_option, stop_on_signals
from cdc_pipeline.config import ConfigError, PipelineConfig
from cdc_pipeline.postgres import session

if TYPE_CHECKING:  # the engine pulls in psycopg and pyarrow: only when the verb runs
    from cdc_pipeline.backfill.engine import Backfiller, Progress
    from cdc_pipeline.state.backfills import BackfillInfo

MANAGE = ("list", "pause", "resume", "cancel")


@dataclass(frozen=True)
class Output:
    """How a backfill reports: `--json` result, `--quiet` progress."""

    as_json: bool
    quiet: bool
    drain: bool
    max_query_ms: int | None
    metrics_port: int | None = None


@click.command(
    cls=Verb, short_help="backfill a table to its sinks; list/pause/resume/cancel backfills",
    epilog=examples(
        "cdc-pipeline backfill public.orders                          # every sink that receives it",
        "cdc-pipeline backfill public.orders --sink orders_mirror --sort-column updated_at \\",
        "    --start 2024-01-01 --end 2024-02-01                      # a partial backfill",
        "cdc-pipeline backfill public.orders --drain                  # no drain running elsewhere",
        "cdc-pipeline backfill list [--all] [--json]",
        "cdc-pipeline backfill pause|resume|cancel ID"))
@config_option
@click.argument("target", metavar="TABLE|list|pause|resume|cancel")
@click.argument("backfill_id", metavar="[ID]", required=False)
@click.option("--sink", "sinks", multiple=True, help="backfill to this sink (repeatable; default: every sink that "
              "receives the table)")
@click.option("--sort-column", help="partial backfill: order by this column (then the primary key)")
@click.option("--start", help="partial backfill: first sort-column value, inclusive")
@click.option("--end", help="partial backfill: end sort-column value, exclusive")
@click.option("--max-query-ms", type=int, help="keep each select under this (default: backfill.max_query_ms)")
@click.option("--wait", is_flag=True, help="wait while another process backfills the same table and sink")
@click.option("--drain", is_flag=True, help="also run the drain in this process (when nothing else does)")
@click.option("--all", "every", is_flag=True, help="list: include finished backfills")
@click.option("--json", "as_json", is_flag=True, help="list: JSON output; run: print the result as JSON")
@click.option("--quiet", is_flag=True, help="no progress lines")
@metrics_option
@click.pass_context
def backfill(ctx: click.Context, target: str, backfill_id: str | None, sinks: tuple[str, ...],
             sort_column: str | None, start: str | None, end: str | None, max_query_ms: int | None, wait: bool,
             drain: bool, every: bool, as_json: bool, quiet: bool, metrics_port: int | None) -> int:
    """Run a backfill of TABLE (schema.table or table) in the foreground: its rows go to its sinks as
    `read` messages (a drain must be running, or pass --drain). Or manage backfills: list, pause ID,
    resume ID, cancel ID. Rows whose sort column is NULL are not part of a partial backfill.

    Exits 0 when completed, 130 when interrupted (resume continues from the checkpoint), 1 on failure,
    2 on a config error."""
    from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest
    from cdc_pipeline.state.backfills import BackfillError

    config = load(ctx)
    out = Output(as_json, quiet, drain, max_query_ms, metrics_port)
    try:
        if target in MANAGE:
            if target != "list" and not backfill_id:
                raise ConfigError(f"backfill {target}: give the backfill ID (see `cdc-pipeline backfill list`)")
            return _manage(config, target, backfill_id, every, out)
        if backfill_id:
            raise ConfigError(f"backfill {target}: unexpected argument {backfill_id!r}")
        request = BackfillRequest(target, sinks, sort_column, start, end, max_query_ms, origin="cli")
        return _run(config, Backfiller(config, request, on_progress=_printer(out), wait_if_busy=wait), out)
    except BackfillError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _manage(config: PipelineConfig, action: str, backfill_id: str | None, every: bool, out: Output) -> int:

    from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest
    from cdc_pipeline.backfill.progress import describe_backfill
    from cdc_pipeline.state.backfills import BackfillError, BackfillStore

    store = BackfillStore(config.state.schema_name)
    with session.connect(config.state_dsn, autocommit=True) as conn:
        if action == "list":
            items = store.list(conn, active_only=not every)
            if out.as_json:
                print(json.dumps([i.as_dict() for i in items], indent=2, default=str))
            elif not items:
                print("no active backfills" + ("" if every else " (--all shows finished ones)"))
            for info in [] if out.as_json else items:
                print(describe_backfill(info))
            return 0
        assert backfill_id is not None
        if action == "pause":
            store.set_status(conn, backfill_id, "paused")
            print(f"backfill {backfill_id} paused: its runner stops before the next page "
                  f"(`cdc-pipeline backfill resume {backfill_id}` continues it)")
            return 0
        if action == "cancel":
            store.set_status(conn, backfill_id, "cancelled")
            print(f"backfill {backfill_id} cancelled: pages already reconciled stay delivered; staged pages are dropped")
            return 0
        info = store.get(conn, backfill_id)
        if info.status == "completed":  # the drain finished it after its process stopped or died: done
            print(f"backfill {backfill_id} is already completed: {describe_backfill(info)}")
            return 0
        if info.status == "paused":
            store.set_status(conn, backfill_id, "running")
        elif info.status != "running":
            raise BackfillError(f"backfill {backfill_id} is {info.status}; nothing to resume")
        if info.alive:
            print(f"backfill {backfill_id} resumed: its running process continues it")
            return 0
    request = BackfillRequest(info.table, tuple(info.sinks), info.sort_column, info.start, info.end,
                              out.max_query_ms, origin="cli resume")
    backfiller = Backfiller(config, request, on_progress=_printer(out))
    if backfiller.spec.identity != _identity(info):
        raise BackfillError(f"backfill {backfill_id} no longer matches the config (its sinks or table changed); "
                            f"cancel it and start a new one")
    return _run(config, backfiller, out)


def _identity(info: BackfillInfo) -> str:
    from cdc_pipeline.state.backfills import BackfillSpec

    return BackfillSpec(info.table, tuple(sorted(info.sinks)), info.sort_column, info.start, info.end).identity


def _run(config: PipelineConfig, backfiller: Backfiller, out: Output) -> int:
    drain = None
    thread = None
    errors: list[BaseException] = []
    if out.drain:
        from cdc_pipeline.capture.drain import Drain

        drain = Drain(config)

        def _drain() -> None:
            try:
                drain.run()
            except BaseException as exc:  # surfaced after the backfill stops
                errors.append(exc)
                backfiller.stop()

        thread = threading.Thread(target=_drain, name="drain", daemon=True)
        thread.start()

    stop_on_signals(backfiller.stop)
    from cdc_pipeline.ops.health import start_ops

    ops = start_ops(config, out.metrics_port, lambda: [backfiller, *([drain] if drain else [])])
    try:
        result = backfiller.run()
    finally:
        if ops is not None:
            ops.stop()
        if drain is not None and thread is not None:
            drain.stop()
            thread.join(60)
    if errors:
        raise errors[0]
    if out.as_json:
        print(json.dumps({**result.as_metadata(), "warnings": result.warnings}, default=str))
    else:
        print(result.line())
        for warning in result.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    if result.status == "completed":
        return 0
    if result.status == "interrupted":
        print(f"interrupted: `cdc-pipeline backfill resume {result.backfill_id}` continues from the checkpoint",
              file=sys.stderr)
        return 130
    return 1


def _printer(out: Output) -> Callable[[Progress], None] | None:
    if out.quiet:
        return None

    def show(progress: Progress) -> None:
        print(progress.line(), file=sys.stderr, flush=True)

    return show
