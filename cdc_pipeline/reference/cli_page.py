"""The CLI reference, from the click commands: each verb's usage, help, options and examples, in the order
`cdc-pipeline --help` lists them."""

from __future__ import annotations

import inspect

import click

from cdc_pipeline.cli import cli, commands
from cdc_pipeline.reference.markdown import code, table

INTRO = """\
# Command line reference

`cdc-pipeline` (or `python -m cdc_pipeline.cli`). `--config PATH` may come before or after the verb;
without it, `$CDC_CONFIG`. Long options may be shortened to a unique prefix (`--until` for
`--until-idle`). Exit codes: 0 done, 1 failed (one `error: ...` line on stderr, never a secret; `-v` before
the verb logs at INFO and shows the traceback), 2 a config error (`config error: FILE: key: problem`) or a
usage error, 130 an interrupted backfill. Every verb takes `-h`/`--help`.

"""


def _text(text: str | None) -> str:
    """Help text as written: click's `\\b` (no rewrap) markers dropped."""
    lines = inspect.cleandoc(text or "").splitlines()
    return "\n".join(line for line in lines if line.strip() != "\b").strip()


def _examples(epilog: str | None) -> str:
    body = _text(epilog)
    if body.startswith("Examples:"):
        body = inspect.cleandoc(body.removeprefix("Examples:").strip("\n"))
    return f"Examples:\n\n```\n{body}\n```\n\n" if body else ""


def _type(param: click.Parameter) -> str:
    if isinstance(param, click.Option) and param.is_flag:
        return "flag"
    if isinstance(param.type, click.Choice):
        return " or ".join(str(c) for c in param.type.choices)
    return {"FLOAT": "number", "INTEGER": "integer", "TEXT": "text", "PATH": "path"}.get(
        param.type.name.upper(), param.type.name)


def _options(command: click.Command, ctx: click.Context) -> str:
    rows = []
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option) or param.hidden or "--help" in param.opts:
            continue
        names = ", ".join(code(o) + (f" {param.metavar}" if param.metavar and not param.is_flag else "")
                          for o in param.opts + param.secondary_opts)
        default = param.default
        if default in (None, False, ()) or callable(default) or type(default).__name__ == "Sentinel":
            default = None  # no default (click 8.3 marks an unset one with a sentinel)
        extra = " (repeatable)" if param.multiple and "repeatable" not in (param.help or "") else ""
        extra += " (required)" if param.required else ""
        rows.append([names, _type(param), "" if default is None else code(str(default)),
                     (param.help or "") + extra])
    return table(["option", "type", "default", "meaning"], rows) if rows else ""


def _verb(name: str, command: click.Command, root: click.Context) -> str:
    ctx = click.Context(command, info_name=name, parent=root)
    usage = " ".join(["cdc-pipeline", name, *command.collect_usage_pieces(ctx)])
    return "".join([f"## `{name}`\n\n", f"{command.get_short_help_str(limit=200).capitalize()}.\n\n",
                    f"```\n{usage}\n```\n\n", f"{_text(command.help)}\n\n", _options(command, ctx), "\n",
                    _examples(command.epilog)])


def render() -> str:
    root = click.Context(cli, info_name="cdc-pipeline", **cli.context_settings)  # click caches the help option
    verbs = commands()
    parts = [INTRO, "## Global options\n\n", f"{_text(cli.help)}\n\n", _options(cli, root), "\n",
             _examples(cli.epilog), "## Verbs\n\n",
             table(["verb", "what it does"],
                   [[f"[{code(n)}](#{n.replace('-', '-')})", c.get_short_help_str(limit=200)]
                    for n, c in verbs.items()]), "\n"]
    parts += [_verb(name, command, root) for name, command in verbs.items()]
    return "".join(parts).rstrip("\n") + "\n"
