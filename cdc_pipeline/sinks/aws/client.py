"""The aiobotocore client of an AWS destination, and how its errors are read.

An error that speaks for the service as a whole (nothing answering, a timeout, throttling, 5xx, refused
credentials, the configured resource missing) is `DestinationDown`: the engine waits for the service and
counts nothing against a message. Anything else the service refused a request for is that request's
messages' failure. botocore's own retries are kept to one more attempt, so an outage is noticed in
seconds and waited for by the engine, with its backoff, instead of inside a call.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from cdc_pipeline.sinks.base import Unreachable, safe_endpoint
from cdc_pipeline.sinks.batching import DestinationDown

# Error codes of a whole service, not of the messages of a request.
MAX_CONNECTIONS = 1000  # kept open, at most: as many as requests are out at once (the scheduler's)
THROTTLED = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled", "RequestThrottledException",
    "TooManyRequestsException", "ProvisionedThroughputExceededException", "LimitExceededException",
    "KMSThrottlingException", "SlowDown", "RequestLimitExceeded", "ServiceUnavailable", "InternalError",
    "InternalFailure", "InternalServerError", "ServiceUnavailableException", "KMSInternalException",
})
REFUSED = frozenset({
    "AccessDenied", "AccessDeniedException", "AuthorizationError", "InvalidClientTokenId", "SignatureDoesNotMatch",
    "UnrecognizedClientException", "ExpiredToken", "ExpiredTokenException", "InvalidAccessKeyId",
    "MissingAuthenticationToken", "IncompleteSignature", "InvalidSecurity", "KMSAccessDeniedException",
    "KMSDisabledException", "KMSNotFoundException", "KMSInvalidStateException",
})


class AwsClient:
    """One aiobotocore client, opened on the sink's event loop and kept for the run."""

    def __init__(self, service: str, dest: Any) -> None:
        self.service = service
        self.where = safe_endpoint(dest.endpoint_url) if dest.endpoint_url else f"AWS {service} in {dest.region}"
        self._kwargs: dict[str, Any] = {
            "region_name": dest.region, "endpoint_url": dest.endpoint_url,
            "config": Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=dest.timeout_ms / 1000,
                             read_timeout=dest.timeout_ms / 1000, max_pool_connections=MAX_CONNECTIONS),
        }
        if dest.access_key_id is not None:
            self._kwargs["aws_access_key_id"] = dest.access_key_id
            self._kwargs["aws_secret_access_key"] = dest.secret_access_key.get_secret_value()
            if dest.session_token is not None:
                self._kwargs["aws_session_token"] = dest.session_token.get_secret_value()
        self._stack: AsyncExitStack | None = None
        self.api: Any = None

    async def open(self) -> Any:
        await self.close()
        stack = AsyncExitStack()
        self.api = await stack.enter_async_context(get_session().create_client(self.service, **self._kwargs))
        self._stack = stack
        return self.api

    async def close(self) -> None:
        stack, self._stack, self.api = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def call(self, operation: str, **params: Any) -> dict[str, Any]:
        """Call `operation`; an error of the whole service raises DestinationDown (see the module doc), any
        other ClientError is re-raised for the caller to fail its messages with `request_error`."""
        try:
            result: dict[str, Any] = await getattr(self.api, operation)(**params)
            return result
        except ClientError as exc:
            if is_outage(exc):
                raise DestinationDown(f"{self.where}: {describe(exc)}") from None
            raise
        except (BotoCoreError, OSError, TimeoutError) as exc:
            raise DestinationDown(f"{self.where} did not answer: {type(exc).__name__}") from None


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def is_outage(exc: ClientError) -> bool:
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    code = error_code(exc)
    return status >= 500 or status in (401, 403, 429) or code in THROTTLED or code in REFUSED


def describe(exc: ClientError) -> str:
    """`Code: message` of a service error (AWS's messages name resources, never credentials)."""
    error = exc.response.get("Error", {})
    return f"{error.get('Code', 'error')}: {str(error.get('Message', ''))[:300]}"


def entry_result(code: str, message: str, sender_fault: bool = True) -> str:
    """A failed entry's result: the message's own failure, or Unreachable when the service could not take it
    (throttled, its own fault): retried later without counting against the message."""
    text = f"{code}: {message[:300]}"
    return Unreachable(text) if (not sender_fault or code in THROTTLED) else text
