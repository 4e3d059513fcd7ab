"""The registry of destination types: the one place that lists them.

Each sink type is one package under `cdc_pipeline/sinks/` holding its `destination:` schema (a pydantic model
with a `type` literal) and a `build(sink_config, environ)` that imports its client. A config names a type, this
registry finds the package: one line per type, `type: "package:Model"`. The `Destination` union that
`SinkConfig` validates against and `build_sink` are both derived from it.

config/ sits below sinks/ in the layering, so it names the sink packages here as data and imports them by
name (their schema part is light: pydantic and `config.base` only; the client library is imported by
`build`). See the README's "Writing a sink".
"""

import importlib
from typing import TYPE_CHECKING, Annotated, Any, Union

from pydantic import BaseModel, Field

SINK_TYPES: dict[str, str] = {
    "postgres": "cdc_pipeline.sinks.postgres:PostgresDestination",
    "webhook": "cdc_pipeline.sinks.webhook:WebhookDestination",
    "redis_stream": "cdc_pipeline.sinks.redis_stream:RedisStreamDestination",
    "nats": "cdc_pipeline.sinks.nats:NatsDestination",
    "rabbitmq": "cdc_pipeline.sinks.rabbitmq:RabbitMQDestination",
    "parquet": "cdc_pipeline.sinks.parquet:ParquetDestination",
    "http_pull": "cdc_pipeline.sinks.http_pull:HttpPullDestination",
    "kafka": "cdc_pipeline.sinks.kafka:KafkaDestination",
    "sqs": "cdc_pipeline.sinks.sqs:SqsDestination",
    "sns": "cdc_pipeline.sinks.sns:SnsDestination",
    "kinesis": "cdc_pipeline.sinks.kinesis:KinesisDestination",
    "typesense": "cdc_pipeline.sinks.typesense:TypesenseDestination",
    "delta": "cdc_pipeline.sinks.delta:DeltaDestination",
    "iceberg": "cdc_pipeline.sinks.iceberg:IcebergDestination",
}
DESTINATION_TYPES: tuple[str, ...] = tuple(SINK_TYPES)


def sink_package(kind: str) -> Any:
    """The package of destination type `kind` (KeyError if no such type)."""
    return importlib.import_module(SINK_TYPES[kind].partition(":")[0])


def _schema(kind: str) -> type[BaseModel]:
    model: type[BaseModel] = getattr(sink_package(kind), SINK_TYPES[kind].partition(":")[2])
    declared = model.model_fields["type"].default
    if declared != kind:  # a registry line that names the wrong model would misroute configs silently
        raise TypeError(f"{model.__name__}.type defaults to {declared!r}, but the registry lists it as {kind!r}")
    return model


DESTINATION_MODELS: dict[str, type[BaseModel]] = {kind: _schema(kind) for kind in SINK_TYPES}

if TYPE_CHECKING:
    Destination = Any  # assembled at run time from the registry
else:
    Destination = Annotated[Union[tuple(DESTINATION_MODELS.values())], Field(discriminator="type")]  # noqa: UP007
