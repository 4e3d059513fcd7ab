"""The command line's surface without a database: the verbs (a contract), `--help` with examples for each,
`--config` before or after the verb, and the exit codes of usage and config errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from cdc_pipeline.cli import cli, commands, main

VERBS = ["check", "setup", "drain", "deliver", "status", "failed", "backfill", "api-sync", "serve", "replay", "demo"]


def test_the_verbs_are_the_contract_in_order() -> None:
    assert [c.name for c in commands().values()] == VERBS
    assert cli.list_commands(click.Context(cli)) == VERBS


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_has_help_with_examples(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([verb, "--help"]) == 0
    out = capsys.readouterr().out
    assert f"Usage: cdc-pipeline {verb}" in out and "--config PATH" in out
    examples = out.split("Examples:\n")[1]
    assert all(line.startswith("    ") for line in examples.splitlines()) and f" {verb}" in examples


def test_top_level_help_lists_every_verb(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-h"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {verb} " in out for verb in VERBS) and "Examples:" in out


@pytest.mark.parametrize("argv", [[], ["frob"], ["failed", "bogus"], ["drain", "--seconds", "soon"],
                                  ["check", "--no-such-flag"], ["backfill"], ["demo", "--port", "x"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "Usage: cdc-pipeline" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--config", "{}", "status"], ["status", "--config", "{}"],
                                  ["--config", "/elsewhere.yaml", "backfill", "list", "--config", "{}"],
                                  ["failed", "list", "--json", "--config", "{}"]])
def test_config_before_or_after_the_verb(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.yaml")
    assert main([missing if a == "{}" else a for a in argv]) == 2
    assert capsys.readouterr().err == f"config error: {missing}: file not found\n"


def test_python_dash_m_runs_the_same_cli() -> None:
    proc = subprocess.run([sys.executable, "-m", "cdc_pipeline.cli", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "api-sync" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "cdc_pipeline.cli", "status", "--config", "/no/such.yaml"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == "config error: /no/such.yaml: file not found\n"


def test_long_options_take_a_unique_prefix_as_with_argparse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.yaml")
    # Parsed (the config error comes after parsing): --conf, --until, --sec, --sort, --st, --e, --q.
    for argv in (["--conf", missing, "drain", "--until", "--sec", "1"],
                 ["backfill", "public.t", "--sort", "c", "--st", "-5", "--e", "9", "--q", "--conf", missing]):
        assert main(argv) == 2
        assert capsys.readouterr().err.startswith("config error:")
    # Ambiguous (--sink or --seconds), or an option where a value belongs: usage errors.
    for argv in (["--config", missing, "deliver", "--s", "x"], ["--config", missing, "backfill", "t", "--start", "--end", "5"]):
        assert main(argv) == 2
        assert "Usage: cdc-pipeline" in capsys.readouterr().err
