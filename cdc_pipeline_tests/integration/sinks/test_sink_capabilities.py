"""A sink type owns its capabilities: added as one package and one registry line (to a copy of the
package, nothing else edited), it shows what its class declares in `status`, in `check` and in its
Dagster asset's metadata, with no type test anywhere else (sinks/base.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from cdc_pipeline_tests.conftest import Database
from cdc_pipeline_tests.unit.test_sink_registry import package_with_echo

_CLIENT = '''from collections.abc import Sequence
from typing import Any

from cdc_pipeline.core.findings import Finding
from cdc_pipeline.sinks.base import OutboundMessage, Sink, SinkConfigLike


class EchoSink(Sink):
    def __init__(self, sink_config: SinkConfigLike) -> None:
        self.prefix = sink_config.destination.prefix

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        return [None] * len(batch)

    @classmethod
    def asset_metadata(cls, sink_config: SinkConfigLike) -> dict[str, str]:
        return {"echo_prefix": sink_config.destination.prefix}

    @classmethod
    def check_findings(cls, sink_config: SinkConfigLike) -> list[Finding]:
        return [Finding("warning", f"sink {sink_config.name}", "echo forgets what it is sent")]

    @classmethod
    def status(cls, sink_config: SinkConfigLike, conn: Any, schema: str) -> dict[str, Any]:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s", (schema,)).fetchone()[0]
        return {"echo": {"prefix": sink_config.destination.prefix, "state_tables": tables > 0}}
'''

_METADATA = '''
import json, sys
from dagster import AssetKey
from cdc_pipeline.defs import build_definitions

defs = build_definitions(sys.argv[1])
spec = defs.resolve_assets_def(AssetKey(["sink", "shout"])).specs_by_key[AssetKey(["sink", "shout"])]
print(json.dumps({k: str(v) for k, v in spec.metadata.items()}))
'''


def test_a_fixture_sink_shows_in_status_check_and_asset_metadata(source_db: Database, tmp_path: Path) -> None:
    package_with_echo(tmp_path, _CLIENT)
    source_db.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    config = tmp_path / "cdc.yaml"
    config.write_text(yaml.safe_dump({
        "source": {"dsn": source_db.dsn, "slot": "cdc_test", "publication": "cdc_test"},
        "tables": [{"name": "public.items"}],
        "sinks": [{"name": "shout", "tables": ["public.items"], "destination": {"type": "echo", "prefix": "p-"}}],
    }))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode in (0, 1), done.stderr
        return done.stdout

    where = run("-c", "import cdc_pipeline; print(cdc_pipeline.__file__)")
    assert Path(where.strip()).is_relative_to(tmp_path)  # the edited copy runs, not the installed package
    run("-m", "cdc_pipeline.cli", "--config", str(config), "setup")

    assert "WARNING sink shout: echo forgets what it is sent" in run(
        "-m", "cdc_pipeline.cli", "--config", str(config), "check").splitlines()
    shown = json.loads(run("-m", "cdc_pipeline.cli", "--config", str(config), "status", "--json"))["sinks"]["shout"]
    assert shown["echo"] == {"prefix": "p-", "state_tables": True}
    assert shown["offset"] == "0:-1"  # and the figures every sink has
    assert json.loads(run("-c", _METADATA, str(config)))["echo_prefix"] == "p-"
