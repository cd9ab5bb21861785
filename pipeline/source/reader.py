"""Reading one range of a Pulsar partition on an executor, in bulk, into Arrow record batches.

:func:`read_range` re-reads exactly the messages of one :class:`Range` (ids in (start, end], in
partition order) and yields record batches of :data:`SPARK_SCHEMA`'s Arrow schema, which PySpark
passes on with no row conversion. It is called once per input partition per micro-batch, and
again for the same range after a crash. The driver plans ranges without reading a message
(``probes.py``, ``offsets.py``).

Only the standard Pulsar protocol is used (readers from message ids; no seek, no
subscriptions), so the same code runs on pulsar-lite and Apache Pulsar.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Iterator

from pipeline.errors import SourceError
from pipeline.source.offsets import EARLIEST, WHOLE_ENTRY, Position, Range, through

log = logging.getLogger(__name__)
ARROW_BATCH_ROWS = 16_384
# position = entry position << ENTRY_SHIFT | (batch index + 1): it orders the messages of a
# partition and generation (entries of up to a million messages; Pulsar caps a message at 5 MB)
ENTRY_SHIFT = 20
_clients: dict[str, object] = {}


def new_client(service_url: str):
    import pulsar

    return pulsar.Client(service_url, operation_timeout_seconds=15, connection_timeout_ms=5000,
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def pulsar_client(service_url: str):
    """One client per URL per Python process (workers are reused, so connections are too)."""
    client = _clients.get(service_url)
    if client is None:
        client = _clients[service_url] = new_client(service_url)
    return client


def to_message_id(text: str):
    import pulsar

    if text == EARLIEST:
        return pulsar.MessageId.earliest
    pos = Position.parse(text)
    return pulsar.MessageId(pos.partition, pos.ledger, pos.entry, pos.batch)


def id_text(message_id) -> str:
    return f"{message_id.ledger_id()}:{message_id.entry_id()}:{message_id.partition()}:{message_id.batch_index()}"


def batch_size(message_id) -> int | None:
    """How many messages the entry of a batched message id holds (None if the id does not say).

    pulsar-client does not expose it, but its serialised id (the protocol's MessageIdData)
    carries it as field 6, ``batch_size``.
    """
    data, i = message_id.serialize(), 0
    try:
        while i < len(data):
            tag, i = _varint(data, i)
            if tag & 7 == 0:
                value, i = _varint(data, i)
                if tag >> 3 == 6:
                    return value or None
            elif tag & 7 == 2:
                length, i = _varint(data, i)
                i += length
            else:
                return None
    except IndexError:
        return None
    return None


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return value, i
        shift += 7


def partition_topic(topic: str, partition: str) -> str:
    """The Pulsar topic name of a partition key ('-1' is a non-partitioned topic)."""
    return topic if partition == "-1" else f"{topic}-partition-{partition}"


def open_reader(service_url: str, topic: str, start_id: str, receiver_queue: int = 5000, client=None):
    """A non-durable reader positioned right after ``start_id`` (or at the earliest message).

    After a whole entry (batch index -1) it starts *at* the next entry, inclusively: pulsar-lite
    0.2.0 answers a reader started after a batched entry by sending that entry again, and such a
    reader sometimes goes silent right after it (measured: 2 in 300 range reads).
    """
    import pulsar

    inclusive = False
    start = to_message_id(start_id)
    if start_id != EARLIEST:
        pos = Position.parse(start_id)
        if pos.batch < 0:
            start, inclusive = pulsar.MessageId(pos.partition, pos.ledger, pos.entry + 1, -1), True
    try:
        return (client or pulsar_client(service_url)).create_reader(
            topic, start, receiver_queue_size=receiver_queue, start_message_id_inclusive=inclusive)
    except Exception as exc:  # the C++ client raises its own types (Timeout, TopicNotFound, …)
        raise SourceError(f"cannot open a reader on {topic!r} at {start_id!r} via {service_url!r}: {exc}") from exc


def read_range(service_url: str, topic: str, kind: str, rng: Range, quiet_timeout_s: float = 60.0) -> Iterator:
    """Yield Arrow batches with exactly the messages of ``rng``: ids after ``rng.start_id``
    through ``rng.end_id`` (an end with batch index -1 covers its whole entry).

    # {"kind": "orders", "topic": "persistent://…/orders", "partition": -1, "message_id": "0:5:-1:2",
    #  "position": 5242883, "generation": 0, "key": "1001", "value": b'{…}', "publish_time": ts, "properties": None}

    Raises SourceError when the broker sends nothing for ``quiet_timeout_s`` while the range
    is unfinished (the broker is down, or the topic was truncated or recreated).
    """
    end = through(rng.end_id)
    stream = _RangeStream(service_url, partition_topic(topic, rng.partition), topic, rng.start_id, end, quiet_timeout_s)
    columns = _Columns(kind, topic, int(rng.partition), rng.gen)
    entry_n, entry = rng.start_n, None
    try:
        while True:
            found = stream.next()
            if found is None or found[1] > end:
                break
            message, at, batch = found
            if at[:2] != entry:
                entry, entry_n = at[:2], entry_n + 1
            columns.append(message, at, batch, (entry_n << ENTRY_SHIFT) | (batch + 1))
            if columns.rows >= ARROW_BATCH_ROWS:
                yield columns.take()
            if at == end or stream.end_entry_read():  # nothing of the range is left
                break
        if columns.rows:
            yield columns.take()
    finally:
        stream.close()


class _Columns:
    """The columns of one Arrow batch being read: lists per message, constants once per batch."""

    def __init__(self, kind: str, topic: str, partition: int, generation: int):
        self.kind, self.topic, self.partition, self.generation = kind, topic, partition, generation
        self._clear()

    def _clear(self) -> None:
        self.ledgers, self.entries, self.batches, self.positions = [], [], [], []
        self.keys, self.values, self.times, self.properties = [], [], [], []

    @property
    def rows(self) -> int:
        return len(self.values)

    def append(self, message, at: tuple[int, int, int], batch: int, position: int) -> None:
        key, properties = read_key_and_properties(message)
        self.ledgers.append(at[0])
        self.entries.append(at[1])
        self.batches.append(batch)
        self.positions.append(position)
        self.keys.append(key)
        self.values.append(message.data())
        self.times.append(message.publish_timestamp())
        self.properties.append(properties)

    def take(self):
        """The rows so far as one record batch of :func:`arrow_schema` (and start afresh)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = self.rows
        text = pa.string()
        ids = pc.binary_join_element_wise(
            pa.array(self.ledgers, pa.int64()).cast(text), pa.array(self.entries, pa.int64()).cast(text),
            pa.repeat(pa.scalar(str(self.partition), text), n), pa.array(self.batches, pa.int64()).cast(text), ":")
        arrays = [
            pa.repeat(pa.scalar(self.kind, text), n), pa.repeat(pa.scalar(self.topic, text), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            ids, pa.array(self.positions, pa.int64()), pa.repeat(pa.scalar(self.generation, pa.int64()), n),
            pa.array(self.keys, text), pa.array(self.values, pa.binary()),
            pc.multiply(pa.array(self.times, pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC")),
            pa.array(self.properties, text),
        ]
        self._clear()
        return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema())


def read_key_and_properties(message) -> tuple[str | None, str | None]:
    """A message's key (None if it has none) and its properties as sorted JSON (None if none),
    whatever bytes the producer sent.

    pulsar-client decodes both as strict UTF-8 and raises ``UnicodeDecodeError`` on anything
    else (the protocol does not stop a producer from sending other bytes). Raised here, that
    would fail the range and every retry of it, so one message would stop the job. Instead:

    - a UTF-8 key is kept exactly as sent (a tombstone's key is the id it deletes);
    - any other key is kept with its bad bytes escaped (``b"1\\xff"`` -> ``"1\\\\xff"``), which is
      never an integer, so the parse step makes such a tombstone a dead letter; an order or an
      upsert does not use its key and goes on;
    - properties that are not UTF-8 cannot be read at all (the client has no raw accessor), so
      they become None, with a warning: the message goes on without a ``redrive-of``.
    """
    try:
        key = message.partition_key() or None
    except UnicodeDecodeError as exc:
        key = bytes(exc.object).decode("utf-8", "backslashreplace")  # exc.object: the whole key as sent
    try:
        props = message.properties()
    except UnicodeDecodeError as exc:
        log.warning("message %s on %r has properties that are not UTF-8 (%s); read without properties",
                    id_text(message.message_id()), message.topic_name(), exc)
        props = None
    return key, (json.dumps(props, sort_keys=True) if props else None)


class _RangeStream:
    """The messages after a start id, each once, up to an end, from a reader on its own
    connection that is reopened if it stalls.

    pulsar-lite 0.2.0 sometimes stops feeding a reader while another reader is being served,
    on any topic and any connection: measured outside Spark with plain readers, 2 to 6 range
    reads in 300 stalled when two processes read at once, and none in 300 read one at a time
    (bench/README.md). It also sends entries again, so each message is taken once by id.
    Until the end entry is reached the messages are known to exist (the driver planned the
    range from the broker's newest entry), so a reader that goes silent before it is reopened
    on a fresh connection right after the last message it gave; from the end entry on, an
    empty queue and a broker with nothing newer mean the range is done.
    """

    STALL_S = 0.3  # silence before the first reopen; doubled at each reopen of one range, up to 4 s
    stalls = 0  # reopened readers in this process (the benchmark and tests read it)

    def __init__(self, service_url: str, name: str, topic: str, start_id: str, end: tuple[int, int, int],
                 quiet_timeout_s: float):
        self.service_url, self.name, self.topic = service_url, name, topic
        self.start_id, self.last, self.end = start_id, through(start_id), end
        self.last_found = None  # the MessageId of the last message given (its text only when needed)
        self.end_size = None  # messages in the end entry, once a message of it is seen
        self.quiet_timeout_s, self.stall_s = quiet_timeout_s, self.STALL_S
        self.client = self.reader = None
        self._open(start_id)

    def _open(self, start_id: str) -> None:
        try:
            self.client = new_client(self.service_url)
        except Exception as exc:
            raise SourceError(f"cannot connect to {self.service_url!r} to read {self.topic!r}: {exc}") from exc
        self.reader = open_reader(self.service_url, self.name, start_id, client=self.client)
        self.opened, self.delivered = time.monotonic(), 0
        # pulsar-client's Reader and Message are thin Python wrappers over its _pulsar objects,
        # which have the same methods; reading those directly saves two objects and five calls a
        # message (a fifth of the read cost here)
        self._read_next = getattr(self.reader, "_reader", self.reader).read_next

    def next(self):
        """(message, its ``through`` key, its batch index) of the next message not seen yet, or
        None when the end entry has been read and the broker has nothing newer."""
        import pulsar

        quiet_since = silent_since = time.monotonic()  # the first restarts at each reopen
        wait_ms = 1  # the receiver queue is usually warm; only an empty one waits longer
        while True:
            try:
                message = self._read_next(wait_ms)
            except pulsar.Timeout:
                if self.end_entry_read() or (self.last[:2] >= self.end[:2] and self.end_size is None
                                             and not self._more_on_broker()):
                    return None
                now = time.monotonic()
                if now - silent_since > self.quiet_timeout_s:
                    raise SourceError(f"{self.topic!r}: no message after {self.last_id} for {self.quiet_timeout_s:.0f}s "
                                      f"while re-reading a committed range; is the broker up, or was the topic "
                                      f"truncated or recreated?") from None
                if now - quiet_since > self.stall_s:
                    # A reopen costs a few milliseconds and at most one entry read again, so a
                    # short threshold is cheap even when the silence was only a busy machine.
                    _RangeStream.stalls += 1
                    log.warning("reader on %r stalled after %s (%d messages and %.1fs after it opened, silent "
                                "%.1fs); reopening on a new connection", self.name, self.last_id, self.delivered,
                                now - self.opened, now - quiet_since)
                    self.close()
                    self._open(self.last_id)
                    quiet_since, self.stall_s = time.monotonic(), min(4.0, 2 * self.stall_s)
                wait_ms = 100
                continue
            found = message.message_id()
            batch = found.batch_index()
            key = (found.ledger_id(), found.entry_id(), batch if batch >= 0 else WHOLE_ENTRY)
            self.delivered += 1
            if batch >= 0 and self.end_size is None and key[:2] == self.end[:2]:
                self.end_size = batch_size(found)
            if key > self.last:  # anything else was sent again: seen already
                self.last, self.last_found = key, found
                return message, key, batch

    def end_entry_read(self) -> bool:
        """Whether the last message given is the last one of the end entry.

        Known from the entry's batch size, which each batched message id carries. (An empty
        receiver queue is no proof: the client may still be unpacking the entry.)
        """
        return (self.last[:2] == self.end[:2] and self.end_size is not None
                and self.last[2] >= self.end_size - 1)

    @property
    def last_id(self) -> str:
        return self.start_id if self.last_found is None else id_text(self.last_found)

    def _more_on_broker(self) -> bool:
        try:
            return self.reader.has_message_available()
        except Exception:  # a dead broker: keep waiting, the quiet timeout reports it
            return True

    def close(self) -> None:
        for closeable in (self.reader, self.client):
            try:
                if closeable is not None:
                    closeable.close()
            except Exception:  # closing a reader of a dead broker must not mask the real error
                pass


def arrow_schema():
    import pyarrow as pa

    return pa.schema([
        ("kind", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("message_id", pa.string()),
        ("position", pa.int64()), ("generation", pa.int64()), ("key", pa.string()), ("value", pa.binary()),
        ("publish_time", pa.timestamp("us", tz="UTC")), ("properties", pa.string()),
    ])


SPARK_SCHEMA = ("kind string, topic string, partition int, message_id string, position long, generation long, "
                "key string, value binary, publish_time timestamp, properties string")
