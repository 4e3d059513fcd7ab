"""`cdc-pipeline`: the command line. Each verb calls the same code as the Dagster op or sensor."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from cdc_pipeline.backfill.cli import add_parser as add_backfill_parser
from cdc_pipeline.config import ConfigError, PipelineConfig, load_config, redact


def _config(args: argparse.Namespace) -> PipelineConfig:
    config = load_config(args.config)
    config.check_dsns()
    return config


def cmd_check(args: argparse.Namespace) -> int:
    from cdc_pipeline.setup import check

    findings = check(_config(args))
    for f in findings:
        print(f)
    return 1 if any(f.level == "error" for f in findings) else 0


def cmd_setup(args: argparse.Namespace) -> int:
    from cdc_pipeline.setup import setup

    done = setup(_config(args))
    print("\n".join(done) if done else "nothing to do: publication, slot and state schema exist")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    from cdc_pipeline.capture.drain import Drain

    drain = Drain(_config(args))
    _stop_on_signals(drain.stop)
    stats = drain.run(seconds=args.seconds, until_idle=args.until_idle)
    print(f"drained {stats.changes} changes in {stats.transactions} transactions in {stats.seconds:.1f} s "
          f"({stats.rate:.0f} changes/s); confirmed LSN {stats.committed_lsn}; {stats.sessions} replication "
          f"sessions, {stats.retries} retries")
    return 0


def cmd_deliver(args: argparse.Namespace) -> int:
    from cdc_pipeline.delivery.engine import Deliverer
    from cdc_pipeline.delivery.spark_stage import spark_session

    config = _config(args)
    sinks = [config.sink(args.sink)] if args.sink else list(config.sinks)
    if not sinks:
        raise ConfigError(f"{config.path}: no sinks configured")
    spark = spark_session(config.spark)
    out = open(args.output, "w") if args.output else sys.stdout  # noqa: SIM115 - closed below
    try:
        for sink in sinks:
            deliverer = Deliverer(config, sink, spark, dry_run=args.dry_run, dry_run_out=out)
            _stop_on_signals(deliverer.stop)
            # A dry run shows what is waiting now; it does not wait for more unless given --seconds.
            until_idle = args.until_idle or (args.dry_run and args.seconds is None)
            stats = deliverer.run(until_idle=until_idle, seconds=args.seconds)
            print(f"sink {sink.name}: " + json.dumps(stats.as_metadata()), file=sys.stderr if args.dry_run else sys.stdout)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from cdc_pipeline import status

    data = status.collect(_config(args))
    print(json.dumps(data, indent=2, default=str) if args.json else status.render(data))
    return 0


def cmd_failed(args: argparse.Namespace) -> int:
    import psycopg

    from cdc_pipeline.state.store import Store

    config = _config(args)
    if args.sink:
        config.sink(args.sink)  # unknown sink: a clear error
    store = Store(config.state.schema_name)
    with psycopg.connect(config.state_dsn) as conn:
        if args.action == "list":
            items = store.list_failed(conn, args.sink)
            if args.json:
                print(json.dumps(items, indent=2, default=str))
            for it in [] if args.json else items:
                print(f"{it['sink']} {it['id']} group={it['group_key']} {it['status']} attempts={it['attempts']} "
                      f"next={it['next_attempt_at']:%Y-%m-%d %H:%M:%S} error={it['last_error']}")
            if not items and not args.json:
                print("no failed messages")
            return 0
        if not args.all and not args.id:
            raise ConfigError(f"failed {args.action}: give a message ID (from `failed list`) or --all")
        position = None
        if args.id:
            lsn, _, idx = args.id.partition(":")
            if not (lsn.isdigit() and idx.lstrip("-").isdigit()):
                raise ConfigError(f"failed {args.action}: {args.id!r} is not a message ID like 24681234:3")
            position = (int(lsn), int(idx))
        fn = store.retry_now if args.action == "retry" else store.discard_now
        n = fn(conn, args.sink, position)
        conn.commit()
    verb = "due for retry now" if args.action == "retry" else "discarded"
    print(f"{n} message(s) {verb}")
    return 0 if n or args.all else 1


def cmd_api_sync(args: argparse.Namespace) -> int:
    from cdc_pipeline.api_sync.loop import ApiSync

    sync = ApiSync(_config(args), source=args.source)
    _stop_on_signals(sync.stop)
    for name, stats in sync.run(until_idle=args.until_idle, seconds=args.seconds).items():
        print(f"api source {name}: {stats.records} records written, {stats.deleted} deleted, "
              f"{stats.requests} requests in {stats.seconds:.1f} s ({', '.join(stats.collections) or 'no collections'})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from cdc_pipeline.demo import run_demo

    return run_demo(port=args.port, seconds=args.seconds, ui=not args.no_ui)


def _stop_on_signals(stop: object) -> None:
    def handler(signum: int, frame: object) -> None:
        stop()  # type: ignore[operator]

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cdc-pipeline", description=__doc__)
    p.add_argument("--config", help="path to cdc.yaml (default: $CDC_CONFIG)")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="verb", required=True)
    # `--config` also after the verb (`cdc-pipeline check --config F`); SUPPRESS keeps an absent one from
    # overwriting a `--config` given before the verb.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help="path to cdc.yaml (default: $CDC_CONFIG)")
    add = sub.add_parser

    def add_parser(name: str, **kw: Any) -> argparse.ArgumentParser:
        return add(name, parents=[common, *kw.pop("parents", [])], **kw)

    sub.add_parser = add_parser  # type: ignore[method-assign]
    sub.add_parser("check", help="check config and source readiness").set_defaults(fn=cmd_check)
    sub.add_parser("setup", help="create publication, slot and state schema (idempotent)").set_defaults(fn=cmd_setup)
    d = sub.add_parser("drain", help="stream the replication slot into the change log")
    d.add_argument("--until-idle", action="store_true", help="stop once caught up with the source")
    d.add_argument("--seconds", type=float, default=None, help="stop after this long")
    d.set_defaults(fn=cmd_drain)
    v = sub.add_parser("deliver", help="deliver the change log to sinks")
    v.add_argument("--sink", help="one sink (default: all, one after the other)")
    v.add_argument("--until-idle", action="store_true", help="stop once the sink has caught up")
    v.add_argument("--seconds", type=float, default=None)
    v.add_argument("--dry-run", action="store_true", help="print what would be sent; touch nothing")
    v.add_argument("--output", help="with --dry-run: write the messages (JSON lines) to this file")
    v.set_defaults(fn=cmd_deliver)
    s = sub.add_parser("status", help="slot lag, log, sink offsets, failed messages")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_status)
    f = sub.add_parser("failed", help="list, retry or discard parked messages")
    f.add_argument("action", choices=["list", "retry", "discard"])
    f.add_argument("id", nargs="?", help="message ID (commit_lsn:commit_idx) for retry/discard")
    f.add_argument("--all", action="store_true", help="retry/discard every parked message (of --sink)")
    f.add_argument("--sink", help="only this sink")
    f.add_argument("--json", action="store_true")
    f.set_defaults(fn=cmd_failed)
    add_backfill_parser(sub)
    a = sub.add_parser("api-sync", help="backfill and keep syncing API sources into Postgres tables")
    a.add_argument("--source", help="one API source (default: all)")
    a.add_argument("--until-idle", action="store_true", help="stop once every collection has caught up")
    a.add_argument("--seconds", type=float, default=None, help="stop after this long")
    a.set_defaults(fn=cmd_api_sync)
    m = sub.add_parser("demo", help="embedded Postgres + sample load + pipeline + Dagster UI")
    m.add_argument("--port", type=int, default=3000)
    m.add_argument("--seconds", type=float, default=None, help="stop after this long (default: until Ctrl-C)")
    m.add_argument("--no-ui", action="store_true")
    m.set_defaults(fn=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.fn(args))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # one clear line, never a secret
        print(f"error: {type(exc).__name__}: {redact(str(exc))}", file=sys.stderr)
        if args.verbose:
            raise
        return 1


if __name__ == "__main__":
    sys.exit(main())
