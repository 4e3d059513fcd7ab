"""Kafka sink on confluent-kafka (librdkafka): an idempotent producer with `acks=all`.

* Each message is a record of `route or topic`: value = the message JSON, key = its group (so a group's
  order is its partition's order; ungrouped messages have no key), headers `idempotency_key`, `table`
  and `action`. A message counts as delivered when its delivery report says the broker acknowledged it.
* A group's next record is produced only once the previous one's delivery report says it was stored (a record
  the broker rejects, too large for it or not authorized, must never let its key's next record be stored
  first: the idempotent producer keeps order through its own retries, not through a rejection). That is the
  scheduler's (delivery/schedule/): the calls are not `ordered`, so each holds at most one message per group,
  produced together (a flush sends what is queued at once). A message librdkafka refuses before sending
  (larger than `max_message_bytes`, an unknown or untrusted topic) fails alone.
* A producer in a fatal state (librdkafka's `_FATAL`: an unrecoverable sequence gap, a fenced producer) is
  an outage of the sink, not any message's failure: nothing more is produced in the call (its results end
  there: the scheduler hands the rest back), the message it refused is `Unreachable`, and the next call builds
  a new producer.
* Outage: an unreachable broker is `SinkUnavailable` (open() asks for metadata first), and a broker that
  goes away during a call ends the call once all brokers have been down for DOWN_GRACE_S (or the
  delivery timeout passes): what is not acknowledged is purged and reported `Unreachable`, the producer is
  dropped and the next call connects afresh.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from cdc_pipeline.sinks.base import (
    Limits,
    OutboundMessage,
    Sink,
    SinkConfigError,
    SinkConfigLike,
    SinkUnavailable,
    Unreachable,
)
from cdc_pipeline.sinks.kafka.topics import headers, topic_problem

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
DOWN_GRACE_S = 2.0  # all brokers down this long during a call: stop waiting for acknowledgements
_PENDING = "\x00pending"  # placeholder result; never returned (compared by identity)
# Errors that say the broker did not answer for the message, not that it refused it.
_UNREACHABLE = {
    KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
    KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION, KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
}


def producer_config(dest: Any, environ: Mapping[str, str]) -> dict[str, Any]:
    """librdkafka's settings for a destination; secrets are read from the named environment variables."""
    conf: dict[str, Any] = {
        "bootstrap.servers": dest.bootstrap_servers, "client.id": dest.client_id,
        "enable.idempotence": True, "acks": "all", "linger.ms": dest.linger_ms,
        "compression.type": dest.compression, "message.timeout.ms": dest.delivery_timeout_ms,
        "message.max.bytes": dest.max_message_bytes, "security.protocol": dest.security_protocol,
    }
    if dest.sasl_mechanism:
        conf.update({"sasl.mechanism": dest.sasl_mechanism, "sasl.username": dest.sasl_username,
                     "sasl.password": _secret(environ, dest.sasl_password_env)})
    for key in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
        if getattr(dest, key):
            conf[key.replace("_", ".")] = getattr(dest, key)
    if dest.ssl_key_password_env:
        conf["ssl.key.password"] = _secret(environ, dest.ssl_key_password_env)
    return conf


def _secret(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name)
    if not value:
        raise SinkConfigError(f"environment variable {name} (a kafka secret) is not set")
    return value


class KafkaSink(Sink):
    def __init__(self, sink_config: SinkConfigLike, environ: Mapping[str, str]) -> None:
        dest = sink_config.destination
        self.name = sink_config.name
        self.topic: str = dest.topic
        self.servers: str = dest.bootstrap_servers  # host:port list: no credentials in it
        self.route_prefixes: list[str] | None = dest.route_prefixes
        self.timeout_s = dest.delivery_timeout_ms / 1000
        self._conf = producer_config(dest, environ)
        self._producer: Producer | None = None
        self._down_since: float | None = None
        self._fatal: str | None = None  # why the producer failed for good (librdkafka's fatal error)

    # -- lifecycle --------------------------------------------------------------------------------
    def open(self) -> None:
        self._connect()

    def _connect(self) -> Producer:
        producer = Producer({**self._conf, "error_cb": self._on_error, "logger": log})
        try:
            producer.list_topics(timeout=CONNECT_TIMEOUT_S)  # a reachable broker answers metadata
        except KafkaException as exc:
            raise SinkUnavailable(f"kafka sink {self.name!r}: cannot reach {self.servers}: {_text(exc)}") from exc
        self._producer, self._down_since, self._fatal = producer, None, None
        return producer

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.purge()  # nothing is waiting for these: a call settles all it sent
            producer.flush(0)

    def _on_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self._down_since = self._down_since or time.monotonic()
        if err.fatal():
            self._fatal = f"{err.name()}: {err.str()}"
        log.info("kafka sink %s: %s", self.name, err.str())

    # -- delivery ---------------------------------------------------------------------------------
    def limits(self) -> Limits:
        return Limits(ordered=False)  # a group's next record waits for the previous one's delivery report

    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        if self._producer is not None and (self._down_since is not None or self._fatal is not None):
            self.close()  # brokers gone since the last call, or a dead producer: only a fresh one tells
        producer = self._producer or self._connect()
        call = _Call([_PENDING] * len(batch))
        for i, m in enumerate(batch):
            if self._fatal is not None:  # the producer died under this call: the rest waits for a new one
                del call.results[i:]  # not attempted: the results end here
                break
            error = topic_problem(m.route, self.route_prefixes) or self._produce(producer, m, i, call)
            if error is not None:
                call.results[i] = error
        while call.outstanding and self._wait(producer, call):
            pass
        return self._finish(call.results)

    def _finish(self, results: list[str | None]) -> list[str | None]:
        lost = False
        for i, r in enumerate(results):
            if r is _PENDING:
                results[i] = Unreachable(f"no acknowledgement from {self.servers} within "
                                         f"{int(self.timeout_s * 1000)} ms (it may still have been stored)")
            lost = lost or isinstance(results[i], Unreachable)
        if lost:  # start over with a fresh producer: whatever it still holds was reported undelivered
            self.close()
            if all(isinstance(r, Unreachable) for r in results):
                raise SinkUnavailable(f"kafka sink {self.name!r}: {self.servers} did not acknowledge anything: "
                                      f"{next(r for r in results if isinstance(r, Unreachable))}")
        return results

    def _produce(self, producer: Producer, m: OutboundMessage, i: int, call: _Call) -> str | None:
        """Queue one record; returns why librdkafka refused it (an ``Unreachable`` when the producer itself
        is dead: an outage of the sink, not the message's fault), or None."""
        while True:
            try:
                producer.produce(m.route or self.topic, value=m.payload,
                                 key=m.group.encode() if m.group is not None else None,
                                 headers=headers(m.key, m.payload), on_delivery=self._report(call, i))
                call.outstanding += 1
                return None
            except BufferError:  # the local queue is full: serve delivery reports to make room
                producer.poll(0.05)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and (err.fatal() or err.code() == KafkaError._FATAL):
                    self._fatal = _text(exc)
                    log.warning("kafka sink %s: the producer failed for good (%s); a new one takes over",
                                self.name, self._fatal)
                    return Unreachable(f"kafka: the producer failed ({self._fatal}); not sent")
                return f"kafka: {_text(exc)}"

    def _report(self, call: _Call, i: int) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            call.outstanding -= 1
            call.progress_at = time.monotonic()
            if err is None:
                call.results[i] = None
                self._down_since = None
            elif err.code() in _UNREACHABLE or err.retriable() or err.fatal():
                if err.fatal():
                    self._fatal = f"{err.name()}: {err.str()}"
                call.results[i] = Unreachable(f"kafka: {err.name()}: {err.str()}")
            else:
                call.results[i] = f"kafka: {err.name()}: {err.str()}"
        return on_delivery

    def _wait(self, producer: Producer, call: _Call) -> bool:
        """Serve delivery reports for a moment (a flush sends what is queued at once, linger or not); False
        when the brokers are gone or the time is up: what is left is purged and reported unanswered."""
        producer.flush(0.05)
        now = time.monotonic()
        down = self._down_since is not None and now - self._down_since >= DOWN_GRACE_S
        # No report for the delivery timeout (and a connect's time): what is out is given up on.
        silent = now - call.progress_at >= self.timeout_s + CONNECT_TIMEOUT_S
        if not (down or silent or self._fatal is not None):
            return True
        producer.purge()  # their reports come back as _PURGE_*: Unreachable
        producer.flush(1.0)
        return False


class _Call:
    """One call's results, as its delivery reports come."""

    def __init__(self, results: list[str | None]) -> None:
        self.results = results
        self.outstanding = 0
        self.progress_at = time.monotonic()  # the call's start, then its last delivery report


def _text(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return f"{err.name()}: {err.str()}" if isinstance(err, KafkaError) else f"{type(exc).__name__}: {exc}"
