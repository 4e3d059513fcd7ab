"""`cdc-pipeline backfill ...`: run a backfill in the foreground, or list / pause / resume / cancel them.

    cdc-pipeline backfill TABLE [--sink NAME ...] [--sort-column C] [--start V] [--end V] [--max-query-ms N]
    cdc-pipeline backfill list [--all] [--json]
    cdc-pipeline backfill pause|resume|cancel ID
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from cdc_pipeline.config import ConfigError, PipelineConfig, load_config

if TYPE_CHECKING:  # the engine pulls in psycopg and pyarrow: only when the verb runs
    from cdc_pipeline.backfill.engine import Backfiller, Progress
    from cdc_pipeline.backfill.state import BackfillInfo

VERBS = ("list", "pause", "resume", "cancel")


def add_parser(sub: Any) -> None:
    b = sub.add_parser(
        "backfill", help="backfill a table's rows to its sinks as read messages; list/pause/resume/cancel backfills",
        description="Run a backfill of TABLE in the foreground (a drain must be running, or pass --drain), "
                    "or manage backfills: list, pause ID, resume ID, cancel ID. Rows whose sort column is NULL "
                    "are not part of a partial backfill.")
    b.add_argument("target", help="TABLE (schema.table or table), or one of: list, pause, resume, cancel")
    b.add_argument("id", nargs="?", help="the backfill ID for pause, resume and cancel")
    b.add_argument("--sink", action="append", default=[], help="backfill to this sink (repeatable; default: every "
                   "sink that receives the table)")
    b.add_argument("--sort-column", help="partial backfill: order by this column (then the primary key)")
    b.add_argument("--start", help="partial backfill: first sort-column value, inclusive")
    b.add_argument("--end", help="partial backfill: end sort-column value, exclusive")
    b.add_argument("--max-query-ms", type=int, help="keep each select under this (default: backfill.max_query_ms)")
    b.add_argument("--wait", action="store_true", help="wait while another process backfills the same table and sink")
    b.add_argument("--drain", action="store_true", help="also run the drain in this process (when nothing else does)")
    b.add_argument("--all", action="store_true", help="list: include finished backfills")
    b.add_argument("--json", action="store_true", help="list: JSON output; run: print the result as JSON")
    b.add_argument("--quiet", action="store_true", help="no progress lines")
    b.set_defaults(fn=cmd_backfill)


def cmd_backfill(args: argparse.Namespace) -> int:
    from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest
    from cdc_pipeline.backfill.state import BackfillError

    config = load_config(args.config)
    try:
        if args.target in VERBS:
            if args.target != "list" and not args.id:
                raise ConfigError(f"backfill {args.target}: give the backfill ID (see `cdc-pipeline backfill list`)")
            return _manage(config, args)
        if args.id:
            raise ConfigError(f"backfill {args.target}: unexpected argument {args.id!r}")
        request = BackfillRequest(args.target, tuple(args.sink), args.sort_column, args.start, args.end,
                                  args.max_query_ms, origin="cli")
        return _run(config, Backfiller(config, request, on_progress=_printer(args), wait_if_busy=args.wait), args)
    except BackfillError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _manage(config: PipelineConfig, args: argparse.Namespace) -> int:
    import psycopg

    from cdc_pipeline.backfill.engine import Backfiller, BackfillRequest
    from cdc_pipeline.backfill.progress import describe_backfill
    from cdc_pipeline.backfill.state import BackfillError, BackfillStore

    store = BackfillStore(config.state.schema_name)
    with psycopg.connect(config.state_dsn, autocommit=True) as conn:
        if args.target == "list":
            items = store.list(conn, active_only=not args.all)
            if args.json:
                print(json.dumps([i.as_dict() for i in items], indent=2, default=str))
            elif not items:
                print("no active backfills" + ("" if args.all else " (--all shows finished ones)"))
            for info in [] if args.json else items:
                print(describe_backfill(info))
            return 0
        if args.target == "pause":
            store.set_status(conn, args.id, "paused")
            print(f"backfill {args.id} paused: its runner stops before the next page "
                  f"(`cdc-pipeline backfill resume {args.id}` continues it)")
            return 0
        if args.target == "cancel":
            store.set_status(conn, args.id, "cancelled")
            print(f"backfill {args.id} cancelled: pages already reconciled stay delivered; staged pages are dropped")
            return 0
        info = store.get(conn, args.id)
        if info.status == "paused":
            store.set_status(conn, args.id, "running")
        elif info.status != "running":
            raise BackfillError(f"backfill {args.id} is {info.status}; nothing to resume")
        if info.alive:
            print(f"backfill {args.id} resumed: its running process continues it")
            return 0
    request = BackfillRequest(info.table, tuple(info.sinks), info.sort_column, info.start, info.end,
                              args.max_query_ms, origin="cli resume")
    backfiller = Backfiller(config, request, on_progress=_printer(args))
    if backfiller.spec.identity != _identity(info):
        raise BackfillError(f"backfill {args.id} no longer matches the config (its sinks or table changed); "
                            f"cancel it and start a new one")
    return _run(config, backfiller, args)


def _identity(info: BackfillInfo) -> str:
    from cdc_pipeline.backfill.state import BackfillSpec

    return BackfillSpec(info.table, tuple(sorted(info.sinks)), info.sort_column, info.start, info.end).identity


def _run(config: PipelineConfig, backfiller: Backfiller, args: argparse.Namespace) -> int:
    drain = None
    thread = None
    errors: list[BaseException] = []
    if args.drain:
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

    def handler(signum: int, frame: object) -> None:
        backfiller.stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    try:
        result = backfiller.run()
    finally:
        if drain is not None and thread is not None:
            drain.stop()
            thread.join(60)
    if errors:
        raise errors[0]
    if args.json:
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


def _printer(args: argparse.Namespace) -> Any:
    if args.quiet:
        return None

    def show(progress: Progress) -> None:
        print(progress.line(), file=sys.stderr, flush=True)

    return show

