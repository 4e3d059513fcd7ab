"""`check` and `setup`: is the source ready, and create what capture needs."""

from __future__ import annotations

import click

from cdc_pipeline.cli.common import Verb, config_option, examples, load


@click.command(cls=Verb, short_help="check config and source readiness", epilog=examples(
    "cdc-pipeline --config cdc.yaml check",
    "cdc-pipeline check && cdc-pipeline setup      # the way to start ($CDC_CONFIG names the file)"))
@config_option
@click.pass_context
def check(ctx: click.Context) -> int:
    """Check the config and the source's readiness: wal_level, privileges, tables, primary keys, replica
    identity, publication, slot, state schema, and each sink's filter/transform/route.

    One finding per line: ERROR blocks capture (exit 1), WARNING works but loses something, TODO is what
    `setup` will create, OK passed."""
    from cdc_pipeline.admin.check import check as run_check

    findings = run_check(load(ctx))
    for f in findings:
        print(f)
    return 1 if any(f.level == "error" for f in findings) else 0


@click.command(cls=Verb, short_help="create publication, slot and state schema (idempotent)", epilog=examples(
    "cdc-pipeline --config cdc.yaml setup"))
@config_option
@click.pass_context
def setup(ctx: click.Context) -> int:
    """Create the publication, the replication slot (pgoutput) and the state schema; idempotent, and adds
    newly configured tables to the publication. Refuses, creating nothing, while `check` finds an error."""
    from cdc_pipeline.admin.setup import setup as run_setup

    done = run_setup(load(ctx))
    print("\n".join(done) if done else "nothing to do: publication, slot and state schema exist")
    return 0
