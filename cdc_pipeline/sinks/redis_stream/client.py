"""Redis Streams sink: one XADD per message, `{"key": idempotency key, "data": payload}`.

Each batch goes out as non-transactional pipelines (one round trip per PIPELINE_CHUNK messages, no
MULTI/EXEC), so an error on one command (e.g. WRONGTYPE because the routed key holds a string) fails
only that message; the pipeline carries on past it (a later message of its group is then stored before
the failed one's retry: the engine parks it behind the failure, and it is delivered again after it).
Commands of one connection execute in order, so stream order is commit order.
At-least-once: a connection lost after the server applied part of a pipeline makes the caller resend
those messages; consumers recognise duplicates by the `key` field.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
import redis.exceptions

from cdc_pipeline.sinks.base import (
    OutboundMessage,
    Sink,
    SinkConfigLike,
    SinkUnavailable,
    Unreachable,
    safe_endpoint,
)

# Bounds the client-side command buffer and the reply list per round trip; the round trips themselves
# are noise (measured here: pipelines of 1k, 10k and 200k commands all run at 80-100k msgs/s).
PIPELINE_CHUNK = 10_000
_TRANSIENT = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class RedisStreamSink(Sink):
    def __init__(self, sink_config: SinkConfigLike) -> None:
        dest = sink_config.destination
        self.name = sink_config.name
        self.url: str = dest.url
        self.stream_key: str = dest.stream_key
        self.maxlen: int | None = dest.maxlen
        self._client: redis.Redis | None = None

    def open(self) -> None:
        self._client = redis.Redis.from_url(
            self.url, socket_connect_timeout=5, socket_timeout=30, health_check_interval=30
        )
        try:
            self._client.ping()  # fail fast in open() rather than on the first batch
        except _TRANSIENT as exc:
            self.close()
            raise SinkUnavailable(self._why(exc)) from exc

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        if self._client is None:
            self.open()
        assert self._client is not None
        results: list[str | None] = []
        for start in range(0, len(batch), PIPELINE_CHUNK):
            chunk = batch[start:start + PIPELINE_CHUNK]
            pipe = self._client.pipeline(transaction=False)
            for m in chunk:
                pipe.xadd(m.route or self.stream_key, {"key": m.key, "data": m.payload},
                          maxlen=self.maxlen, approximate=True)
            try:
                replies = pipe.execute(raise_on_error=False)
            except _TRANSIENT as exc:
                if not any(r is None for r in results):
                    raise SinkUnavailable(self._why(exc)) from exc
                # Part of the batch is acknowledged: report the rest so the caller keeps the part.
                reason = Unreachable(f"not delivered: {self._why(exc)}")
                results.extend(reason for _ in range(len(batch) - len(results)))
                break
            finally:
                pipe.reset()
            results.extend(f"redis: {r}" if isinstance(r, Exception) else None for r in replies)
        return results

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _why(self, exc: BaseException) -> str:
        # Exception text from redis-py names host:port at most, never the password.
        return f"redis sink {self.name!r}: {safe_endpoint(self.url)} unreachable: {type(exc).__name__}: {exc}"
