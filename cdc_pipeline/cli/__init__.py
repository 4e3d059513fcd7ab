"""`cdc-pipeline`: the command line, on click. Each verb runs the same code as the Dagster op or sensor
that does the job.

One small module per verb group; to add a verb, write a `click.command` in its group's module (or a new
one) and add it to `VERBS` below. `main(argv)` returns the exit code: 0 done, 1 failed, 2 a config or
usage error (one line on stderr, never a secret), 130 an interrupted backfill.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from cdc_pipeline.cli.common import CONFIG_HELP, Settings, examples, expand_prefixes
from cdc_pipeline.config import ConfigError, redact

# Registration, in the order `--help` lists them: verb -> its module in this package and command. A verb's
# module is imported when the verb runs, so each pays only for its own start-up (a `deliver` does not import
# the backfill's or the demo's code).
VERBS: dict[str, str] = {
    "check": "setup_check:check",
    "setup": "setup_check:setup",
    "drain": "capture:drain",
    "deliver": "delivery:deliver",
    "status": "status:status",
    "failed": "delivery:failed",
    "backfill": "backfill:backfill",
    "api-sync": "api_sync:api_sync",
    "serve": "consumers:serve",
    "replay": "consumers:replay",
    "demo": "demo:demo",
}
# Long-running verbs stop cleanly on a signal, also one that came before they started (console.py).
STOPPABLE = frozenset({"drain", "deliver", "serve", "api-sync", "backfill", "demo"})


class _Verbs(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(VERBS)  # registration order, not alphabetical

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in VERBS:
            return None
        module, _, name = VERBS[cmd_name].partition(":")
        command: click.Command = getattr(importlib.import_module(f"cdc_pipeline.cli.{module}"), name)
        return command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, expand_prefixes(self, ctx, args, until_verb=True))


@click.group(cls=_Verbs, context_settings={"help_option_names": ["-h", "--help"]}, epilog=examples(
    "cdc-pipeline --config cdc.yaml check && cdc-pipeline --config cdc.yaml setup",
    "cdc-pipeline drain --config cdc.yaml       # --config also after the verb",
    "CDC_CONFIG=cdc.yaml cdc-pipeline deliver --sink orders_mirror --until-idle",
    "cdc-pipeline VERB --help                    # each verb's options and examples"))
@click.option("--config", metavar="PATH", help=CONFIG_HELP)
@click.option("-v", "--verbose", is_flag=True, help="log at INFO; show the traceback of an unexpected error")
@click.pass_context
def cli(ctx: click.Context, config: str | None, verbose: bool) -> None:
    """Loss-free, ordered change data capture from PostgreSQL to sinks: each verb runs the same code as the
    Dagster op or sensor that does the job."""
    settings = ctx.ensure_object(Settings)
    settings.config, settings.verbose = config, verbose
    if ctx.invoked_subcommand not in STOPPABLE:
        # The console script took the signals first thing (console.py); a short verb gets their previous
        # handling back, and one that came during start-up ends it as it would have.
        from cdc_pipeline.ops.signals import shutdown

        shutdown.release()
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def commands() -> dict[str, click.Command]:
    """Every verb's command, imported (for the generated reference)."""
    ctx = click.Context(cli, **cli.context_settings)
    return {name: command for name in VERBS if (command := cli.get_command(ctx, name)) is not None}


def run() -> NoReturn:
    """The `cdc-pipeline` console script: one verb, then a fast exit (cli/fast_exit.py)."""
    from cdc_pipeline.cli.fast_exit import exit_now

    exit_now(main())


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb; returns its exit code (the console script exits with it)."""
    settings = Settings()
    try:
        code = cli.main(args=list(argv) if argv is not None else sys.argv[1:], prog_name="cdc-pipeline",
                        standalone_mode=False, obj=settings)
        return int(code or 0)
    except click.ClickException as exc:  # usage errors: exit 2, like argparse's
        exc.show()
        return exc.exit_code
    except click.Abort as exc:  # click turns Ctrl-C outside a verb's own handler into Abort
        raise KeyboardInterrupt from exc
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # one clear line, never a secret nor the application's data
        print(f"error: {type(exc).__name__}: {redact(_without_data(exc))}", file=sys.stderr)
        if settings.verbose:
            raise
        return 1


def _without_data(exc: Exception) -> str:
    """A server's data exception (SQLSTATE class 22) quotes the value in its detail and context lines: only
    its primary message is shown."""
    diag = getattr(exc, "diag", None)
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if diag is not None and sqlstate.startswith("22"):
        primary = (diag.message_primary or "").split(': "')[0]  # 'invalid input syntax for type T: "value"'
        return f"{primary} (SQLSTATE {sqlstate}; the value is not shown)"
    return str(exc)
