"""The sink registry: a new destination type is one package under sinks/ plus one registry line.

The first test does exactly that to a copy of the package (nothing else edited) and runs the copy in a
fresh interpreter: the new type must validate, appear in the error lines, be built and deliver.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import cdc_pipeline
from cdc_pipeline.config import DESTINATION_MODELS, DESTINATION_TYPES
from cdc_pipeline.config.destinations import SINK_TYPES, sink_package
from cdc_pipeline.sinks.base import Sink

_BASE_YAML = """\
source: {dsn: 'postgresql://u@h/db'}
tables: [{name: t}]
sinks:
"""

_ECHO_INIT = '''"""Echo sink: remembers what it was sent (a test's hypothetical destination type)."""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from cdc_pipeline.config.base import StrictModel
from cdc_pipeline.sinks.base import Sink, SinkConfigLike


class EchoDestination(StrictModel):
    type: Literal["echo"] = "echo"
    prefix: str = Field(min_length=1)


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.echo.client import EchoSink

    return EchoSink(sink_config)


def sink_class() -> type[Sink]:
    from cdc_pipeline.sinks.echo.client import EchoSink

    return EchoSink
'''

_ECHO_CLIENT = '''from collections.abc import Sequence

from cdc_pipeline.sinks.base import OutboundMessage, Sink, SinkConfigLike


class EchoSink(Sink):
    def __init__(self, sink_config: SinkConfigLike) -> None:
        self.prefix = sink_config.destination.prefix
        self.seen: list[str] = []

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        self.seen.extend(self.prefix + m.key for m in batch)
        return [None] * len(batch)
'''

_DRIVER = '''
import json, sys
import cdc_pipeline
from cdc_pipeline.config import ConfigError, parse_config
from cdc_pipeline.sinks import build_sink
from cdc_pipeline.sinks.base import OutboundMessage

base = sys.argv[1]
config = parse_config(base + "  - {name: e, tables: [t], destination: {type: echo, prefix: 'p-'}}\\n", "cdc.yaml")
with build_sink(config.sink("e")) as sink:
    results = sink.deliver([OutboundMessage("k1", None, None, b"{}"), OutboundMessage("k2", "g", None, b"{}")])
errors = []
for bad in ("{type: echo}", "{type: pulsar}", "{prefix: x}"):
    try:
        parse_config(base + "  - {name: e, tables: [t], destination: " + bad + "}\\n", "cdc.yaml")
    except ConfigError as exc:
        errors.append(str(exc))
print(json.dumps({"package": cdc_pipeline.__file__, "type": type(sink).__name__, "results": results, "seen": sink.seen, "errors": errors}))
'''


def package_with_echo(root: Path, client: str = _ECHO_CLIENT) -> None:
    """A copy of the package under ``root`` with the echo sink added as a sink type is: one package under
    sinks/ (schema, build, its class) and one registry line, nothing else edited."""
    copy = root / "cdc_pipeline"
    shutil.copytree(Path(cdc_pipeline.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "sinks" / "echo").mkdir()
    (copy / "sinks" / "echo" / "__init__.py").write_text(_ECHO_INIT)
    (copy / "sinks" / "echo" / "client.py").write_text(client)
    registry = copy / "config" / "destinations.py"
    text = registry.read_text()
    anchor = '    "http_pull": "cdc_pipeline.sinks.http_pull:HttpPullDestination",\n'
    assert anchor in text
    registry.write_text(text.replace(anchor, anchor + '    "echo": "cdc_pipeline.sinks.echo:EchoDestination",\n'))


def test_a_new_sink_type_is_one_package_and_one_registry_line(tmp_path: Path) -> None:
    package_with_echo(tmp_path)
    out = subprocess.run([sys.executable, "-c", _DRIVER, _BASE_YAML], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
                         capture_output=True, text=True, timeout=60, check=True).stdout
    got = json.loads(out)
    assert Path(got["package"]).is_relative_to(tmp_path)  # the edited copy ran, not the installed package
    assert got["type"] == "EchoSink"
    assert got["results"] == [None, None]
    assert got["seen"] == ["p-k1", "p-k2"]
    assert got["errors"][0] == "cdc.yaml: sinks[0].destination.prefix: required key is missing"
    assert got["errors"][1].endswith(
        "sinks[0].destination.type: must be one of 'postgres', 'webhook', 'redis_stream', 'nats', 'rabbitmq', "
        "'parquet', 'http_pull', 'echo', 'kafka', 'sqs', 'sns', 'kinesis', 'typesense', 'delta', 'iceberg' (got 'pulsar')")
    assert got["errors"][2].endswith("sinks[0].destination.type: required key is missing (one of 'postgres', 'webhook', "
                                     "'redis_stream', 'nats', 'rabbitmq', 'parquet', 'http_pull', 'echo', 'kafka', 'sqs', 'sns', "
                                     "'kinesis', 'typesense', 'delta', 'iceberg')")


def test_registry_lines_name_matching_models_and_builders() -> None:
    assert tuple(SINK_TYPES) == DESTINATION_TYPES
    for kind, model in DESTINATION_MODELS.items():
        assert model.model_fields["type"].default == kind
        assert callable(sink_package(kind).build)
        assert issubclass(sink_package(kind).sink_class(), Sink)
        assert re.fullmatch(rf"cdc_pipeline\.sinks\.{kind}:{model.__name__}", SINK_TYPES[kind])


def test_loading_a_config_imports_no_client_library() -> None:
    sinks = "".join(f"  - {{name: s{i}, tables: [t], destination: {d}}}\n" for i, d in enumerate([
        "{type: postgres, dsn: 'postgresql://u@h/d', table: t}", "{type: webhook, url: 'http://h/'}",
        "{type: redis_stream}", "{type: nats}", "{type: rabbitmq}", "{type: parquet, path: /tmp/p}",
        "{type: http_pull, token_env: T}", "{type: delta, path: /tmp/d}", "{type: iceberg, warehouse: /tmp/w}"]))
    probe = ("import sys; from cdc_pipeline.config import parse_config; "
             f"c = parse_config({_BASE_YAML + sinks!r}, 'cdc.yaml'); "
             "print(len(c.sinks), sorted(m for m in ('redis', 'nats', 'pika', 'pyarrow', 'pyspark', 'httpx', 'deltalake', "
             "'pyiceberg', 'sqlalchemy') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split(maxsplit=1) == ["9", "[]\n"]
