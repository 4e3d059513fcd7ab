"""What the AWS destinations (sqs, sns, kinesis) share: the connection keys of their config schema, and
(`client.py`, imported only when a sink is built) the aiobotocore client and how its errors are read.

Credentials come from the config, typically as `${VAR}`; without them, botocore's own chain (environment,
shared files, instance or task role). `secret_access_key` and `session_token` are secrets: never shown in
errors, logs, metrics or metadata.
"""

from pydantic import Field, SecretStr, field_validator, model_validator

from cdc_pipeline.config.base import ALIAS, StrictModel, url_with_scheme


class AwsConnection(StrictModel):
    region: str = Field(default="us-east-1", min_length=1, description="AWS region of the resource.")
    endpoint_url: str | None = Field(default=None, description="The service's URL instead of AWS's own: a local "
                                     "server (tests, moto, LocalStack) or a compatible service.")
    access_key_id: str | None = Field(default=None, description="Access key id (e.g. `${AWS_ACCESS_KEY_ID}`); "
                                      "none: botocore's own chain (environment, shared files, role).")
    secret_access_key: SecretStr | None = Field(default=None, description="Secret access key (e.g. "
                                                "`${AWS_SECRET_ACCESS_KEY}`); with `access_key_id`.")
    session_token: SecretStr | None = Field(default=None, description="Session token of temporary credentials.")
    timeout_ms: int = Field(default=10_000, gt=0, description="Connect and read timeout of each request; one not "
                            "answered in time is retried later (not counted against its messages).")
    max_in_flight: int | None = Field(default=None, ge=1, le=1000, description=ALIAS.format(key="max_in_flight"))

    @field_validator("endpoint_url")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        return None if value is None else url_with_scheme(value, ("http", "https"))

    @model_validator(mode="after")
    def _check_keys(self) -> "AwsConnection":
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("access_key_id and secret_access_key go together (or neither: botocore's own chain)")
        if self.session_token is not None and self.access_key_id is None:
            raise ValueError("session_token needs access_key_id and secret_access_key")
        return self
