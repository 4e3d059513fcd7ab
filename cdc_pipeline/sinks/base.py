"""The one interface every sink implements, and small helpers the sinks share.

A sink is a client of one destination: it reports what became of each message it was handed. What to
do about a failure (hold the group back, park, retry, give up) is the delivery engine's business alone
(delivery/schedule/ and delivery/parking.py); a sink knows nothing of it. A sink declares its `limits()`
(calls at once, whether a call keeps order): the scheduler keeps within them.

Contract (what the delivery engine relies on):

* `deliver(batch)` returns results in batch order, for the whole batch or a prefix of it: `None` =
  acknowledged by the destination; a string = why that message failed; `NOT_SENT` = not attempted in this
  call. Every message past the end of a shorter list is not attempted (`NOT_SENT`, filled in by the
  scheduler, delivery/schedule/order.py `answered`); a sink may still say `NOT_SENT` itself. More results
  than messages is an error of the sink's.
* Messages arrive in commit order, and what a sink sends keeps that order within each group. A sink may
  stop at a failure and return the results up to it only (the engine hands it the later messages whose
  group is still in order in a next call): sinks that send one request or transaction after another do, so a
  group never reaches the destination past its failed message. A sink that pipelines (sends before the
  earlier messages are acknowledged) declares `Limits(ordered=False)`: the engine then hands it at most one
  message per group per call, so a group's next message goes out only after the previous one was acknowledged.
  A sink never keeps calls in flight of its own: the scheduler has up to its `max_in_flight` calls out (a
  sink whose calls are requests on its event loop: sinks/request_sink.py), each of at most its `batch_size`.
  What a sink did deliver past its group's failure is parked behind it by the engine all the same, and
  redelivered after it (a duplicate the idempotency key identifies).
* `SinkUnavailable` is raised (by `open()` or `deliver()`) when the destination as a whole cannot be
  reached and nothing in the call was acknowledged; the engine retries the whole batch later without
  advancing its offset. Once part of a call is acknowledged, the rest get per-message errors instead.
* A per-message error that says the destination did not answer (timeout, no acknowledgement, lost
  connection, no responders) is an `Unreachable` string: the engine treats a batch in which every
  message sent failed that way as an outage of the destination (not counted against any message),
  and counts such an error against a message only once the destination has accepted other messages.
* Errors never contain secrets: no header values, no passwords or tokens from URLs.
* A sink whose class says `takes_typed_rows` sets `typed_runs`, which takes a run of the log made only of
  typed reads, relayed as COPY text blocks in the form it asks for (state/typed_log.py `RunRows`; no message
  per row): all of it applied (None) or none of it (an error; the engine then hands the run over message by
  message).
* What a sink needs of the delivery that runs it (the state connection, Spark, source tables' shapes, where
  it records its own position) is its `context` (`SinkContext`), handed when it is built and kept current
  by that delivery: a sink has no hooks to be bound through.

Capabilities: what the engine, `status`, `check` and Dagster ask of a sink type, never its type name. They
are class methods given the sink's config, so a place that builds no client (a backfill, `status`,
`check`, the Dagster definitions) asks the class (`sinks.sink_class`); the defaults describe a plain message
sink, and a sink package overrides what its destination does differently.
"""

from __future__ import annotations

import abc
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar
from urllib.parse import urlsplit

from cdc_pipeline.core.findings import Finding

if TYPE_CHECKING:  # a sink package's schema half imports this module: no psycopg nor state/ nor asyncio at load
    import asyncio

    import psycopg

    from cdc_pipeline.state.typed_log import RunRows, TypedRun

T = TypeVar("T")


class TypedRow(NamedTuple):
    """A backfill read carried typed (backfill/typed.py): the row as PostgreSQL composite text, whose
    fields are ``columns`` (name, type as SQL) in order. Only sinks that declare ``takes_typed_rows`` get one."""

    table_schema: str
    table_name: str
    columns: tuple[tuple[str, str], ...]
    text: str


@dataclass(slots=True)
class OutboundMessage:
    key: str  # idempotency key, stable across redeliveries
    group: str | None  # ordering group (None = ungrouped)
    route: str | None  # per-message destination override; None = the destination's default
    payload: bytes  # compact UTF-8 JSON: {"record", "changes", "action", "metadata"}; record null if typed
    typed: TypedRow | None = None  # a typed read: the record travels here instead


class Unreachable(str):
    """A per-message error meaning the destination did not answer for it (timeout, no acknowledgement,
    connection lost, nothing listening), as opposed to the destination rejecting this message."""

    __slots__ = ()


class NotSent(str):
    """The result of a message a sink did not attempt (it stopped at an earlier failure)."""

    __slots__ = ()


NOT_SENT = NotSent("not sent: the sink stopped at an earlier failure of this call")


class SinkUnavailable(Exception):
    """The whole destination is unreachable (connection refused, broker down, DNS): transient; the
    caller retries the whole batch later and does not advance its offset."""


class SinkConfigError(ValueError):
    """The sink's configuration cannot work (e.g. a secret's environment variable is not set)."""


class SinkConfigLike(Protocol):
    """The part of `cdc_pipeline.config.SinkConfig` a sink reads."""

    name: str
    tables: list[str]
    destination: Any


class Limits(NamedTuple):
    """What a sink takes at once: its defaults, which the sink's `batch_size` and `max_in_flight` keys override;
    the scheduler (delivery/schedule/) keeps within them."""

    # Messages per call (a request, a transaction, a run of publishes); None: `delivery.batch_size`.
    batch_size: int | None = None
    # Calls out at once, across micro-batches (delivery/schedule/). More than 1 only for a sink whose calls
    # are requests on its own event loop (sinks/request_sink.py), which has no `own_position`.
    max_in_flight: int = 1
    # A call keeps order within each group (it sends one after another, or stops at a failure). False: it
    # pipelines (sends before earlier messages are acknowledged), so it is handed at most one message per
    # group per call (see the module doc).
    ordered: bool = True


@dataclass(eq=False)
class SinkContext:
    """What the delivery that runs a sink gives it: handed when the sink is built (`sinks.build_sink`), its
    session's fields kept current by that delivery. A sink reads what its destination needs, when it needs it."""

    name: str  # the sink's
    schema: str = "cdc_pipeline"  # the state database's schema
    state_dsn: str | None = None  # the state database (an Iceberg SQL catalog's default home)
    spark: Any = None  # the deliverer's Spark session, started on first use (delivery/lazy_spark.py)
    state: psycopg.Connection | None = None  # the session's state connection, whose transaction commits the offset
    describe: Callable[[str], Any] = lambda table: None  # a source table's shape: 'schema.table' -> TableInfo
    # Where a sink that records its own position (`own_position`) records it: the sink's name, or its lane's in
    # the current split of lanes (core/lanes.py `position_key`); the lane keeper moves it when the split changes.
    position_key: str = ""
    # The earliest message of the call in progress that the engine parks (held back behind its group, failed at
    # the destination or by the transform): it is recorded only in the engine's later commit, so a sink that
    # records its own position must not record one at or past it (schedule/dispatch.py sets it before each call).
    ceiling: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.position_key = self.position_key or self.name


class OwnPosition(Protocol):
    """A destination's own record of how far the sink applied the log, committed with the writes."""

    def read(self, key: str) -> tuple[int, int] | None:
        """The position recorded under ``key`` (`SinkContext.position_key`), if any."""
        ...


TypedRuns = Callable[["TypedRun", "RunRows"], "str | None"]  # a run of typed reads: None (applied) or why not


class Sink(abc.ABC):
    name: str
    # Holds the latest version of each row (a mirror), not a history: a replay continues past its window
    # up to the sink's offset, so the destination ends where its offset says (delivery/replay.py).
    holds_rows: bool = False
    # Capabilities of a built sink, None where it lacks them (the engine asks, never a type name): its own record
    # of its position (read when a session starts, when lanes change, by a replay); runs of typed reads taken
    # whole (delivery/relay.py), for a sink whose class `takes_typed_rows`.
    own_position: OwnPosition | None = None
    typed_runs: TypedRuns | None = None
    _context: SinkContext | None = None

    @property
    def context(self) -> SinkContext:
        """What its delivery gives it (`SinkContext`); a default one until a delivery hands its own."""
        if self._context is None:
            self._context = SinkContext(self.name)
        return self._context

    @context.setter
    def context(self, context: SinkContext) -> None:
        self._context = context

    # open/close are optional (empty on purpose): a sink overrides only what it needs.
    def open(self) -> None:  # noqa: B027
        """Connect; called once per delivery run. May raise SinkUnavailable."""

    @abc.abstractmethod
    def deliver(self, batch: Sequence[OutboundMessage]) -> list[str | None]:
        """A result per message of the batch or of a prefix of it, same order: None = acknowledged by the
        destination, str = why it failed, NOT_SENT = not attempted, as is every message past the end of the
        list (see the module doc). Raises SinkUnavailable when nothing could be delivered."""

    def close(self) -> None:  # noqa: B027
        """Release connections."""

    def limits(self) -> Limits:
        """What it takes at once (`Limits`); the defaults: one ordered call at a time."""
        return Limits()

    # -- capabilities (see the module doc) ----------------------------------------------------------------
    @classmethod
    def takes_truncates(cls, sink_config: SinkConfigLike) -> bool:
        """TRUNCATE is no message action: only a sink that can act on it (a mirror) is handed it."""
        return False

    @classmethod
    def takes_texts(cls, sink_config: SinkConfigLike) -> bool:
        """Its messages carry the log's ``texts`` (values whose JSON does not give the source's value back;
        postgres/pgtypeinfo.py) under a key no consumer sees: for a sink that writes the source's values."""
        return False

    @classmethod
    def gather_seconds(cls, sink_config: SinkConfigLike) -> float:
        """A sink that writes files gathers a trickle of changes: once a block reached the log's end, the next
        is read this many seconds later (a lake table's `flush_seconds`); 0: at once."""
        return 0.0

    @classmethod
    def takes_typed_rows(cls, sink_config: SinkConfigLike) -> bool:
        """Its destination writes typed reads as they are (`TypedRow`, no record; runs through `typed_runs`).
        Whether they reach it so is `sinks.takes_typed`: its messages must need no record too."""
        return False

    @classmethod
    def destination_tables(cls, sink_config: SinkConfigLike) -> list[str]:
        """The tables it writes, 'schema.table', sorted (for a sink that writes tables)."""
        return []

    @classmethod
    def asset_metadata(cls, sink_config: SinkConfigLike) -> dict[str, str]:
        """Metadata of its Dagster asset (never a secret)."""
        tables = cls.destination_tables(sink_config)
        return {"destination_tables": ", ".join(tables)} if tables else {}

    @classmethod
    def check_findings(cls, sink_config: SinkConfigLike) -> list[Finding]:
        """What `check` says about its destination (may connect to it): one finding per problem, with the
        fix; nothing for a destination that is ready."""
        return []

    @classmethod
    def status(cls, sink_config: SinkConfigLike, conn: psycopg.Connection, schema: str) -> dict[str, Any]:
        """Figures of its own for `status`, read from the state database (schema ``schema``)."""
        return {}

    def __enter__(self) -> Sink:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def safe_endpoint(url: str) -> str:
    """scheme://host:port of a URL, for messages: never the user info, path or query (they may hold
    passwords or tokens)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparsable url>"
    return f"{parts.scheme}://{host}{port}" if parts.scheme else f"{host}{port}"


class EventLoopThread:
    """A private event loop on a daemon thread, so asyncio clients (nats-py, pika's asyncio adapter, the
    webhook's HTTP client) sit behind the sinks' synchronous API. One long-lived loop keeps one long-lived
    connection; a loop per call would have to reconnect on every call, since a connection is bound to its
    loop. The loop is the standard library's `asyncio.Runner` (what `asyncio.run` uses): on stop it cancels
    what is left, finalizes async generators and closes, as anyio's blocking portal did, without anyio's
    ~17 ms of imports and start-up in every webhook `deliver`."""

    def __init__(self, name: str) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name=name, daemon=True)
        self._thread.start()
        ready.wait()
        if self._loop is None:
            raise RuntimeError("the sink's event loop did not start")

    def _serve(self, ready: threading.Event) -> None:
        import asyncio

        try:
            with asyncio.Runner() as runner:  # closing: cancel what is still running, finalize, close the loop
                self._loop, self._stopping = runner.get_loop(), asyncio.Event()
                ready.set()
                runner.run(self._stopping.wait())
        finally:
            ready.set()  # a loop that failed to start must not leave __init__ waiting

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait for its result (re-raising its exception); on a timeout the
        coroutine is cancelled."""
        loop = self._loop
        if loop is None:
            coro.close()
            raise RuntimeError("the sink's event loop is stopped")
        import asyncio

        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        """Cancel what is still running on the loop, stop it and join the thread. Idempotent."""
        loop, self._loop = self._loop, None
        if loop is None or self._stopping is None:
            return
        with contextlib.suppress(RuntimeError):  # already closed
            loop.call_soon_threadsafe(self._stopping.set)
        # The thread's end closes the loop: it cancels the client's own background tasks too.
        self._thread.join()
