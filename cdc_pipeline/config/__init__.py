"""The pipeline's YAML configuration (``cdc.yaml``): loading, interpolation, models, error lines.

Contract (the README's "Configuration"; checked from outside): the path comes from ``--config`` or
``CDC_CONFIG``; ``${VAR}`` and ``${VAR:-default}`` are interpolated from the environment; every problem
is reported as one line naming the file, the key path and what is wrong, and secrets never appear in
those lines.

Modules: ``loading`` (file, YAML, interpolation), ``errors`` (ConfigError, redaction),
``error_lines`` (pydantic errors as user lines), ``models`` (the sections and PipelineConfig),
``tables``, ``sinks``, ``api_sources``, and ``destinations``: the registry of destination types, whose
schemas live beside their clients in ``cdc_pipeline/sinks/<type>/``.
"""

from cdc_pipeline.config.api_sources import ApiCollectionConfig, ApiSourceConfig, RateLimitConfig
from cdc_pipeline.config.destinations import DESTINATION_MODELS, DESTINATION_TYPES, Destination
from cdc_pipeline.config.errors import ConfigError, redact
from cdc_pipeline.config.loading import CONFIG_ENV_VAR, load_config, parse_config
from cdc_pipeline.config.models import (
    BackfillConfig,
    DeliveryConfig,
    DrainConfig,
    PipelineConfig,
    SourceConfig,
    SparkConfig,
    StateConfig,
)
from cdc_pipeline.config.sinks import BackoffConfig, EnrichmentConfig, SinkConfig
from cdc_pipeline.config.tables import PartitionsConfig, TableConfig

__all__ = [
    "CONFIG_ENV_VAR",
    "ApiCollectionConfig",
    "ApiSourceConfig",
    "BackfillConfig",
    "BackoffConfig",
    "EnrichmentConfig",
    "ConfigError",
    "DeliveryConfig",
    "DESTINATION_MODELS",
    "DESTINATION_TYPES",
    "Destination",
    "DrainConfig",
    "NatsDestination",
    "ParquetDestination",
    "PartitionsConfig",
    "PipelineConfig",
    "PostgresDestination",
    "RabbitMQDestination",
    "RateLimitConfig",
    "RedisStreamDestination",
    "SinkConfig",
    "SourceConfig",
    "SparkConfig",
    "StateConfig",
    "TableConfig",
    "WebhookDestination",
    "HttpPullDestination",
    "load_config",
    "parse_config",
    "redact",
]


def __getattr__(name: str) -> type:
    """`from cdc_pipeline.config import WebhookDestination` keeps working: the models now live in their sinks."""
    for model in DESTINATION_MODELS.values():
        if model.__name__ == name:
            return model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
