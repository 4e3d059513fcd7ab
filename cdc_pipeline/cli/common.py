"""What every verb shares: the `--config` option (before or after the verb), the loaded config, examples
in `--help`, and stopping long-running verbs cleanly on SIGINT/SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from cdc_pipeline.config import PipelineConfig, load_config

F = TypeVar("F", bound=Callable[..., Any])
CONFIG_HELP = "path to cdc.yaml (default: $CDC_CONFIG)"


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


def load(ctx: click.Context) -> PipelineConfig:
    """The config named by `--config`, else `$CDC_CONFIG`."""
    return load_config(ctx.ensure_object(Settings).config)


def examples(*lines: str) -> str:
    """An `--help` epilog of example command lines, printed as written."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def stop_on_signals(stop: Callable[[], object]) -> None:
    def handler(signum: int, frame: object) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
