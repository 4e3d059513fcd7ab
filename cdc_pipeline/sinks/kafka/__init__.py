"""Kafka sink: each message a record of `route or topic`, keyed by its group, acknowledged by the broker.

This package is the whole `kafka` destination type: its config schema (here, light: loading a config never
imports confluent-kafka), the pure checks (`topics.py`) and the client (`client.py`, imported only when
the sink is built). Secrets are named by environment variable, never written in the config.
"""

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator, model_validator

from cdc_pipeline.config.base import ENV_NAME_RE, StrictModel
from cdc_pipeline.sinks.base import Sink, SinkConfigLike
from cdc_pipeline.sinks.kafka.topics import topic_problem


class KafkaDestination(StrictModel):
    type: Literal["kafka"] = "kafka"
    bootstrap_servers: str = Field(min_length=1, description="The brokers, `host:port[,host:port...]`.")
    topic: str = Field(min_length=1, description="Topic of messages without a route.")
    client_id: str = Field(default="cdc-pipeline", description="The producer's client.id.")
    security_protocol: Literal["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"] = Field(
        default="plaintext", description="How to reach the brokers.")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None, description="SASL mechanism (with a `sasl_*` protocol).")
    sasl_username: str | None = Field(default=None, description="SASL user name.")
    sasl_password_env: str | None = Field(default=None, description="NAME of the environment variable holding "
                                          "the SASL password (never the password).")
    ssl_ca_location: str | None = Field(default=None, description="CA certificate file to verify the brokers.")
    ssl_certificate_location: str | None = Field(default=None, description="Client certificate file.")
    ssl_key_location: str | None = Field(default=None, description="Client key file.")
    ssl_key_password_env: str | None = Field(default=None, description="NAME of the environment variable "
                                             "holding the client key's password.")
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        default="none", description="Compression of produced batches.")
    linger_ms: int = Field(default=5, ge=0, description="How long the producer waits to fill a batch.")
    delivery_timeout_ms: int = Field(default=30000, gt=0, description="A record not acknowledged within this "
                                     "fails (an unreachable broker is an outage).")
    max_message_bytes: int = Field(default=1_000_000, gt=0, description="Largest record; a larger message is "
                                   "that message's failure (parked).")
    route_prefixes: list[str] | None = Field(default=None, description="A route (topic) must start with one of "
                                             "these; none: any valid topic name.")

    @field_validator("topic")
    @classmethod
    def _check_topic(cls, value: str) -> str:
        problem = topic_problem(value, None)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("sasl_password_env", "ssl_key_password_env")
    @classmethod
    def _check_env_name(cls, value: str | None) -> str | None:
        if value is not None and not ENV_NAME_RE.match(value):
            # Deliberately does not echo the value: it is probably the secret itself.
            raise ValueError("must be the NAME of an environment variable holding the secret "
                             "(e.g. KAFKA_PASSWORD), never the secret itself")
        return value

    @model_validator(mode="after")
    def _check_sasl(self) -> "KafkaDestination":
        sasl = self.security_protocol.startswith("sasl_")
        if sasl and not (self.sasl_mechanism and self.sasl_username and self.sasl_password_env):
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_mechanism, sasl_username "
                             "and sasl_password_env")
        if not sasl and (self.sasl_mechanism or self.sasl_password_env):
            raise ValueError("sasl_* keys need security_protocol sasl_plaintext or sasl_ssl")
        return self


def build(sink_config: SinkConfigLike, environ: Mapping[str, str]) -> Sink:
    from cdc_pipeline.sinks.kafka.client import KafkaSink

    return KafkaSink(sink_config, environ)


def sink_class() -> type[Sink]:
    """Its `Sink` class, whose capabilities delivery, `status`, `check` and Dagster ask (imports the client)."""
    from cdc_pipeline.sinks.kafka.client import KafkaSink

    return KafkaSink
