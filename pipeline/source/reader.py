"""Reading Pulsar partitions with non-durable readers: clients, exact ranges, positions.

- :func:`read_range` (executor): re-reads exactly the messages of one :class:`Range` and yields
  Arrow record batches. Called once per input partition per micro-batch, also after a crash.
- Clients, readers, partitions and message ids shared with the driver's look-ahead
  (pipeline/source/cursor.py), and the look-ups a replay needs (:func:`find_position_before`,
  :func:`last_message_id`).

Only the standard Pulsar protocol is used (readers from message ids; no seek, no
subscriptions), so the same code runs on pulsar-lite and Apache Pulsar.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Iterator

from pipeline.config import pulsar_authentication
from pipeline.errors import SourceError
from pipeline.source.offsets import EARLIEST, Position, Range

log = logging.getLogger(__name__)
ARROW_BATCH_ROWS = 8192
# Messages a range reader's client asks the broker for at a time (it asks again after taking
# half). See _RangeStream for why it is not larger.
RANGE_RECEIVER_QUEUE = 5000
_clients: dict[str, object] = {}
# The token each broker URL is reached with in this process (``pulsar.auth_token``): the data
# source sets it from its ``authToken`` option on the driver and in every read task.
_tokens: dict[str, str] = {}


def use_token(service_url: str, token: str | None) -> None:
    """Reach ``service_url`` with ``token`` (None: no authentication) from this process."""
    if token:
        _tokens[service_url] = token
    else:
        _tokens.pop(service_url, None)


def new_client(service_url: str):
    import pulsar

    return pulsar.Client(service_url, operation_timeout_seconds=15, connection_timeout_ms=5000,
                         authentication=pulsar_authentication(_tokens.get(service_url)),
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def pulsar_client(service_url: str):
    """One client per URL per Python process (workers are reused, so connections are too)."""
    client = _clients.get(service_url)
    if client is None:
        client = _clients[service_url] = new_client(service_url)
    return client


def client_message_id(text: str):
    """A message id text as the C++ client's own id object, as messages carry it: readers start
    from it, and ids of one partition compare with ``<`` (ledger, entry, batch), which the read
    loops use to skip messages sent again."""
    import _pulsar

    if text == EARLIEST:
        return _pulsar.MessageId.earliest
    pos = Position.parse(text)
    return _pulsar.MessageId(pos.partition, pos.ledger, pos.entry, pos.batch)


def id_text(message_id) -> str:
    return f"{message_id.ledger_id()}:{message_id.entry_id()}:{message_id.partition()}:{message_id.batch_index()}"


def partition_topic(topic: str, partition: str) -> str:
    """The Pulsar topic name of a partition key ('-1' is a non-partitioned topic)."""
    return topic if partition == "-1" else f"{topic}-partition-{partition}"


def open_reader(service_url: str, topic: str, start_id: str, receiver_queue: int = 5000, client=None):
    """A non-durable reader positioned right after ``start_id`` (or at the earliest message)."""
    try:
        return (client or pulsar_client(service_url)).create_reader(
            topic, client_message_id(start_id), receiver_queue_size=receiver_queue)
    except Exception as exc:  # the C++ client raises its own types (Timeout, TopicNotFound, …)
        raise SourceError(f"cannot open a reader on {topic!r} at {start_id!r} via {service_url!r}: {exc}") from exc


def open_on_own_connection(service_url: str, name: str, start_id: str, receiver_queue: int = 5000):
    """A client of its own (so its own connection) and a reader on it right after ``start_id``.

    Every reader the source keeps reads on a connection of its own, and reopens a reader that
    stalls by calling this again at the last id it took: pulsar-lite 0.2.0 stops feeding a
    reader whose connection's outbound buffer filled up (the README's pulsar-lite notes), and a
    caught-up reader sharing a connection misses new messages.
    """
    try:
        client = new_client(service_url)
    except Exception as exc:
        raise SourceError(f"cannot connect to {service_url!r} to read {name!r}: {exc}") from exc
    try:
        return client, open_reader(service_url, name, start_id, receiver_queue, client=client)
    except Exception:
        close_quietly(client)
        raise


def close_quietly(*closeables) -> None:
    """Close readers and clients; closing one of a dead broker must not mask the real error."""
    for closeable in closeables:
        try:
            if closeable is not None:
                closeable.close()
        except Exception:  # noqa: BLE001 - see the docstring
            pass


def list_partitions(service_url: str, topic: str) -> list[str]:
    """Partition keys of a topic: ['-1'] when it is not partitioned."""
    try:
        names = pulsar_client(service_url).get_topic_partitions(topic)
    except Exception as exc:
        raise SourceError(f"cannot look up partitions of {topic!r} via {service_url!r}: {exc}") from exc
    if len(names) == 1 and names[0] == topic:
        return ["-1"]
    return [name.rsplit("-partition-", 1)[1] for name in names]


def read_range(service_url: str, topic: str, kind: str, rng: Range, read_timeout_s: float = 60.0) -> Iterator:
    """Yield Arrow batches with exactly the ``rng.count`` messages after ``rng.start_id``.

    # {"kind": "orders", "topic": "persistent://…/orders", "partition": -1, "message_id": "0:5:-1:2",
    #  "position": 42, "generation": 0, "key": "1001", "value": b'{…}', "publish_time": ts, "properties": None}
    """
    stream = _RangeStream(service_url, partition_topic(topic, rng.partition), topic, rng.start_id, read_timeout_s)
    position = rng.start_n
    last_id = None
    try:
        while position < rng.end_n:
            block = stream.read(min(ARROW_BATCH_ROWS, rng.end_n - position))
            batch = block.to_arrow(kind, topic, int(rng.partition), position, rng.gen)
            last_id = batch.column("message_id")[-1].as_py()
            position += batch.num_rows
            yield batch
        if last_id is not None and last_id != rng.end_id and rng.end_id != EARLIEST:
            raise SourceError(f"{topic!r} partition {rng.partition}: expected to end at {rng.end_id}, read {last_id}; "
                              "the topic changed under the source (was it truncated or recreated?)")
    finally:
        stream.close()


class _Block:
    """Messages read in a row, as column lists, turned into one Arrow record batch at once.

    Only what differs per message is taken from the client (``_RangeStream.read`` fills the
    lists); the constant columns, the positions and the id texts are built column-wise by Arrow.
    """

    def __init__(self):
        self.ledgers, self.entries, self.batches = [], [], []  # each message's id: ledger:entry:partition:batch
        self.keys, self.values, self.published, self.event_times, self.properties = [], [], [], [], []

    def to_arrow(self, kind: str, topic: str, partition: int, start_n: int, gen: int):
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self.batches)
        message_ids = pc.binary_join_element_wise(
            pa.array(self.ledgers, pa.int64()).cast(pa.string()), pa.array(self.entries, pa.int64()).cast(pa.string()),
            pa.repeat(str(partition), n), pa.array(self.batches, pa.int64()).cast(pa.string()), ":")
        published = pc.multiply(pa.array(self.published, pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC"))
        event_times = pa.array(self.event_times, pa.int64())
        columns = [pa.repeat(kind, n), pa.repeat(topic, n), pa.repeat(pa.scalar(partition, pa.int32()), n),
                   message_ids, pa.array(np.arange(start_n + 1, start_n + n + 1, dtype=np.int64)),
                   pa.repeat(pa.scalar(gen, pa.int64()), n), pa.array(self.keys, pa.string()),
                   pa.array(self.values, pa.binary()), published, pa.array(self.properties, pa.string()),
                   pc.if_else(pc.equal(event_times, 0), None, event_times)]  # 0: the producer set none
        return pa.RecordBatch.from_arrays(columns, schema=arrow_schema())


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
    """The messages after a start id, each once, from a reader on its own connection that is
    reopened if it stalls.

    pulsar-lite 0.2.0 sometimes stops feeding a reader (or sends entries again) when other
    readers have used its connection, which a reused Python worker's shared client always
    has. So each range gets a connection of its own (a few milliseconds to open here), and
    since a committed range is known to exist, a reader that still goes silent is reopened on
    a fresh connection right after the last message it gave.
    """

    STALL_S = 1.5

    def __init__(self, service_url: str, name: str, topic: str, start_id: str, timeout_s: float):
        self.service_url, self.name, self.topic = service_url, name, topic
        self.start_id = start_id
        self.last = self._start = client_message_id(start_id)
        self.deadline = time.monotonic() + timeout_s
        self.client, self.reader = open_on_own_connection(service_url, name, start_id, RANGE_RECEIVER_QUEUE)

    def read(self, count: int) -> _Block:
        """The next ``count`` messages not seen yet (it raises if the deadline passes first)."""
        import pulsar

        block = _Block()
        ledgers, entries, batches, keys, values, published, event_times, properties = (
            block.ledgers, block.entries, block.batches, block.keys, block.values, block.published,
            block.event_times, block.properties)
        # This loop is the source's whole cost (each call into pulsar-client costs about half a
        # microsecond), so it calls the C++ reader under pulsar-client's Python wrapper directly
        # and keeps every lookup local.
        read_next = self.reader._reader.read_next
        last, got = self.last, 0
        ledger = entry = None
        previous_batch = 1 << 62  # the first message read starts an entry
        quiet_since = time.monotonic()
        while got < count:
            try:
                message = read_next(250)
            except pulsar.Timeout:
                now = time.monotonic()
                if now > self.deadline:
                    raise SourceError(f"timed out re-reading committed messages of {self.topic!r}; "
                                      "is the broker up?") from None
                if now - quiet_since > self.STALL_S:
                    after = self.start_id if last is self._start else id_text(last)
                    log.warning("reader on %r stalled after %s; reopening on a new connection", self.name, after)
                    self.close()
                    self.client, self.reader = open_on_own_connection(self.service_url, self.name, after,
                                                                      RANGE_RECEIVER_QUEUE)
                    read_next = self.reader._reader.read_next
                    quiet_since = now
                continue
            found = message.message_id()
            if not last < found:  # sent again: seen already
                continue
            last = found
            try:
                key, props = message.partition_key() or None, message.properties()
            except UnicodeDecodeError:  # rare: bytes that are not UTF-8, read the careful way
                key, props_json = read_key_and_properties(message)
            else:
                props_json = json.dumps(props, sort_keys=True) if props else None
            # A message's batch index says when a new entry starts (it falls back, or is -1 for an
            # unbatched message); only then are the ledger and entry asked for, once an entry.
            batch = found.batch_index()
            if batch <= previous_batch or batch < 0:
                ledger, entry = found.ledger_id(), found.entry_id()
            previous_batch = batch
            ledgers.append(ledger)
            entries.append(entry)
            batches.append(batch)
            keys.append(key)
            properties.append(props_json)
            values.append(message.data())
            published.append(message.publish_timestamp())
            event_times.append(message.event_timestamp())
            got += 1
        self.last = last
        if got and (ledgers[-1], entries[-1]) != (last.ledger_id(), last.entry_id()):  # the rule above broken
            raise SourceError(f"{self.topic!r}: message ids out of entry order before {id_text(last)}")
        return block

    def close(self) -> None:
        close_quietly(self.reader, self.client)


def arrow_schema():
    import pyarrow as pa

    return pa.schema([
        ("kind", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("message_id", pa.string()),
        ("position", pa.int64()), ("generation", pa.int64()), ("key", pa.string()), ("value", pa.binary()),
        ("publish_time", pa.timestamp("us", tz="UTC")), ("properties", pa.string()),
        ("event_time", pa.int64()),  # epoch ms the producer set, or None
    ])


SPARK_SCHEMA = ("kind string, topic string, partition int, message_id string, position long, generation long, "
                "key string, value binary, publish_time timestamp, properties string, event_time long")
SPARK_SCHEMA_NAMES = [column.split()[0] for column in SPARK_SCHEMA.split(", ")]


def find_position_before(service_url: str, topic: str, partition: str, time_ms: int, timeout_s: float = 120.0) -> str:
    """The id of the last message published before ``time_ms`` (EARLIEST if none), by scanning.

    pulsar-lite's seek is broken, so this reads from the start; it runs once per replay request.
    """
    import pulsar

    reader = open_reader(service_url, partition_topic(topic, partition), EARLIEST)
    previous = EARLIEST
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                message = reader.read_next(200)
            except pulsar.Timeout:
                return previous
            if message.publish_timestamp() >= time_ms:
                return previous
            previous = id_text(message.message_id())
        raise SourceError(f"scanning {topic!r} for time {time_ms} took over {timeout_s:.0f}s")
    finally:
        reader.close()


def last_message_id(service_url: str, topic: str, partition: str) -> str | None:
    """The id of the newest message (None for an empty topic).

    The broker answers with the last *entry*; when that entry is a batch, its messages are read
    to find the last one, so a reader started after the answer skips the whole batch.
    The Python client has no non-durable subscriptions, so the probe unsubscribes at once,
    leaving no cursor behind that would hold messages on Apache Pulsar.
    """
    import pulsar

    client = pulsar_client(service_url)
    name = partition_topic(topic, partition)
    try:
        consumer = client.subscribe(name, f"ss-probe-{time.time_ns()}")
    except Exception as exc:
        raise SourceError(f"cannot probe the last message of {topic!r}: {exc}") from exc
    try:
        mid = consumer.get_last_message_id()
    except Exception:  # pulsar-lite raises on an empty topic
        return None
    finally:
        try:
            consumer.unsubscribe()
        except Exception:  # the broker may refuse; closing is enough then
            consumer.close()
    if mid.entry_id() < 0:
        return None
    last = id_text(mid)
    reader = client.create_reader(name, pulsar.MessageId(mid.partition(), mid.ledger_id(), mid.entry_id(), -1),
                                  start_message_id_inclusive=True)
    try:
        while True:
            try:
                found = reader.read_next(500).message_id()
            except pulsar.Timeout:
                return last
            if (found.ledger_id(), found.entry_id()) != (mid.ledger_id(), mid.entry_id()):
                return last
            last = id_text(found)
    finally:
        reader.close()
