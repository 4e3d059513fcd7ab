"""What every verb shares: the `--config` option (before or after the verb), the loaded config, examples
in `--help`, and stopping long-running verbs cleanly on SIGTERM/SIGINT/SIGHUP."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from cdc_pipeline.config import PipelineConfig, load_config
from cdc_pipeline.ops.signals import Shutdown, shutdown

F = TypeVar("F", bound=Callable[..., Any])
CONFIG_HELP = "path to cdc.yaml (default: $CDC_CONFIG)"
_NEGATIVE = re.compile(r"-\d+|-\d*\.\d+")


def expand_prefixes(command: click.Command, ctx: click.Context, args: list[str], *, until_verb: bool) -> list[str]:
    """Long options may be shortened to a unique prefix (`--until` for `--until-idle`), as the argparse CLI
    before click allowed: part of the command-line contract. A value an option consumes is left alone;
    with `until_verb` (the root group) nothing from the verb on is touched."""
    takes_value: dict[str, bool] = {}
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("--"):
                    takes_value[opt] = not (param.is_flag or param.count)
    out: list[str] = []
    value_next = False
    for i, token in enumerate(args):
        if value_next:
            if _looks_like_option(token):  # `--start --end 5`: --start has no value (argparse's rule)
                raise click.UsageError(f"option {out[-1]}: expected one argument", ctx)
            out.append(token)
            value_next = False
            continue
        if token == "--" or (until_verb and not token.startswith("-")):
            return out + args[i:]
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            if name not in takes_value:
                matches = [opt for opt in takes_value if opt.startswith(name)]
                name = matches[0] if len(matches) == 1 else name
            token = name + eq + value
            value_next = takes_value.get(name, False) and not eq
        out.append(token)
    return out


def _looks_like_option(token: str) -> bool:
    return token.startswith("-") and token != "-" and " " not in token and not _NEGATIVE.fullmatch(token)


class Verb(click.Command):
    """A verb: long options accept a unique prefix (see expand_prefixes)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, expand_prefixes(self, ctx, args, until_verb=False))


@dataclass
class Settings:
    """The root options, shared with every verb through click's context object."""

    config: str | None = None
    verbose: bool = False


def _set_config(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    # Given after the verb it wins; absent, it leaves one given before the verb in place.
    if value is not None:
        ctx.ensure_object(Settings).config = value


def config_option(fn: F) -> F:
    """`--config` accepted after the verb too (`cdc-pipeline check --config F`)."""
    return click.option("--config", metavar="PATH", help=CONFIG_HELP, expose_value=False,
                        callback=_set_config)(fn)


def until_options(what: str) -> Callable[[F], F]:
    """`--until-idle` and `--seconds`: without either the verb runs until SIGINT/SIGTERM."""

    def decorate(fn: F) -> F:
        fn = click.option("--seconds", type=float, default=None, help="stop after this long")(fn)
        return click.option("--until-idle", is_flag=True, help=f"stop once {what}")(fn)

    return decorate


def metrics_option(fn: F) -> F:
    """`--metrics-port`: Prometheus /metrics, /healthz and /readyz on this port (default: `metrics.port`, off)."""
    return click.option("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve /metrics, /healthz, /readyz on this port (default: metrics.port; off)")(fn)


def load(ctx: click.Context) -> PipelineConfig:
    """The config named by `--config`, else `$CDC_CONFIG`, its DSNs checked (a fixed message, never a secret)."""
    config = load_config(ctx.ensure_object(Settings).config)
    config.check_dsns()
    return config


def examples(*lines: str) -> str:
    """An `--help` epilog of example command lines, printed as written."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def stop_on_signals(stop: Callable[[], object] | None = None) -> Shutdown:
    """SIGTERM, SIGINT and SIGHUP stop ``stop``'s runner cleanly, a second one forces (ops/signals.py).
    Called first thing in a long-running verb (``stop`` None), so a signal during start-up stops it cleanly
    too, and again with the runner once it exists (called at once if the signal came already)."""
    shutdown.install()
    if stop is not None:
        shutdown.on_stop(stop)
    return shutdown
