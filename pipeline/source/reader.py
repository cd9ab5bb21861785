"""Reading Pulsar partitions with non-durable readers: clients, exact ranges, positions.

- :func:`read_range` (executor): re-reads exactly the messages of one :class:`Range` and yields
  Arrow record batches. Called once per input partition per micro-batch, also after a crash.
- Clients, readers, partitions and message ids, shared with the driver's questions to the
  broker (pipeline/source/probes.py).

Only the standard Pulsar protocol is used (readers from message ids; no seek, no
subscriptions), so the same code runs on pulsar-lite and Apache Pulsar.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from typing import Iterator

from pipeline.config import pulsar_authentication
from pipeline.errors import SourceError
from pipeline.source.offsets import EARLIEST, WHOLE_ENTRY, Position, Range, through
from pipeline.wire import MAX_TIME_MS

log = logging.getLogger(__name__)
# Rows of one Arrow record batch a read task yields: 32k against 8k gave 7% more rows/s in the
# stateless step (fewer hand-overs to the JVM and parse calls); 64k no more (bench/README, stop 22).
ARROW_BATCH_ROWS = 32768
# A message's ``position``: its entry's position in the partition and generation, shifted, plus
# its batch index + 1, so positions grow in read order (a batch index stays below 2**20).
POSITION_SHIFT = 20
LAST_INDEX = (1 << 31) - 1  # a batch index after every real one (the C++ client's is an int32)
# Messages a range reader's client asks the broker for at a time (it asks again after taking
# half). See _RangeStream for why it is not larger.
RANGE_RECEIVER_QUEUE = 5000
# A range's Arrow batches are read ahead of whoever consumes them (the parse step, Spark) up to
# this many bytes, so a range of up to about 200k orders is read whole and its reader closed
# before the first batch is handed on. pulsar-lite counts a reader's permits per entry where
# the client grants them per message, so while a reader is open the broker pushes it the rest
# of the topic, and the C++ client holds every message it got (about 1 KB each) until the
# reader closes: in a backlog, each read worker grew by ~700 MB while it parsed between reads.
READ_AHEAD_BYTES = 64 << 20
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


def client_message_id(text: str, after_whole_entry: bool = False):
    """A message id text as the C++ client's own id object, as messages carry it: readers start
    from it, and ids of one partition compare with ``<`` (ledger, entry, batch), which the read
    loops use to skip messages sent again."""
    import _pulsar

    if text == EARLIEST:
        return _pulsar.MessageId.earliest
    pos = Position.parse(text)
    # "after the whole entry": a batch index above any real one, so ``<`` skips every message of it
    batch = LAST_INDEX if after_whole_entry and pos.batch < 0 else pos.batch
    return _pulsar.MessageId(pos.partition, pos.ledger, pos.entry, batch)


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


class LedgerFacts:
    """What one read found out about its partition's ledgers, for the planner (offsets.plan_entries):
    ``ends[L]``, an entry after which ledger L holds nothing more, and ``next[L]``, the ledger that
    follows L (L = -1: the place before the first message); and how many entries it read."""

    def __init__(self):
        self.ends: dict[int, int] = {}
        self.next: dict[int, int] = {}
        self.entries = 0

    def passed(self, ledger: int, entry: int, following: int) -> None:
        self.ends[ledger] = min(entry, self.ends.get(ledger, entry))
        self.next[ledger] = following


def probe_first_ledger(service_url: str, topic: str, partition: str, timeout_s: float = 60.0) -> LedgerFacts:
    """Executor side: the ledger of a partition's first message (``next[-1]``), read from its
    id (one message, once per partition: datasource.ProbePartition); nothing found when empty."""
    import pulsar

    found = LedgerFacts()
    client, reader = open_on_own_connection(service_url, partition_topic(topic, partition), EARLIEST, 1)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                message = reader.read_next(1000)
            except pulsar.Timeout:
                if not reader.has_message_available():
                    break
                continue
            found.passed(-1, -1, message.message_id().ledger_id())
            break
    finally:
        close_quietly(reader, client)
    return found


def read_range(service_url: str, topic: str, kind: str, rng: Range, read_timeout_s: float = 60.0,
               ledgers: LedgerFacts | None = None) -> Iterator:
    """Yield Arrow batches with exactly the messages after ``rng.start_id`` through ``rng.end_id``.

    An end with batch index -1 covers its whole entry (module docstring of offsets.py); the
    read stops after the entry's last message, known from its batch size, so it never waits
    for a message after the range.

    # {"kind": "orders", "topic": "persistent://…/orders", "partition": -1, "message_id": "0:5:-1:2",
    #  "position": 42 << 20 | 3, "generation": 0, "key": "1001", "value": b'{…}', …}
    """
    stream = _RangeStream(service_url, partition_topic(topic, rng.partition), topic, rng.start_id, rng.end_id,
                          rng.start_n, read_timeout_s, ledgers)
    ahead: deque = deque()  # batches read but not yet handed on; see READ_AHEAD_BYTES
    ahead_bytes = 0
    try:
        while not stream.done:
            block = stream.read(ARROW_BATCH_ROWS)
            if block.batches:
                ahead.append(block.to_arrow(kind, topic, int(rng.partition), rng.gen))
                ahead_bytes += ahead[-1].nbytes
                while ahead and ahead_bytes > READ_AHEAD_BYTES:
                    ahead_bytes -= ahead[0].nbytes
                    yield ahead.popleft()
    finally:
        stream.close()
        if ledgers is not None:
            ledgers.entries = stream.entry_n - rng.start_n
    yield from ahead


def message_batch_size(message_id) -> int | None:
    """How many messages the entry of a batched message id holds (None if the id does not say).

    pulsar-client's Python API does not expose it, but its serialised id (the protocol's
    ``MessageIdData``) carries it as field 6, ``batch_size``.
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


class _Block:
    """Messages read in a row, as column lists, turned into one Arrow record batch at once.

    Only what differs per message is taken from the client (``_RangeStream.read`` fills the
    lists); the constant columns, the positions and the id texts are built column-wise by Arrow.
    """

    def __init__(self):
        self.ledgers, self.entries, self.batches = [], [], []  # each message's id: ledger:entry:partition:batch
        self.entry_ns = []  # each message's entry position in the generation (see POSITION_SHIFT)
        self.keys, self.values, self.published, self.event_times, self.properties = [], [], [], [], []

    def to_arrow(self, kind: str, topic: str, partition: int, gen: int):
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self.batches)
        message_ids = pc.binary_join_element_wise(
            pa.array(self.ledgers, pa.int64()).cast(pa.string()), pa.array(self.entries, pa.int64()).cast(pa.string()),
            pa.repeat(str(partition), n), pa.array(self.batches, pa.int64()).cast(pa.string()), ":")
        published, published_errors = _held_times(self.published, "publish_time")
        event_times, event_errors = _held_times(self.event_times, "event_time")
        published = pc.multiply(published, 1000).cast(pa.timestamp("us", tz="UTC"))
        columns = [pa.repeat(kind, n), pa.repeat(topic, n), pa.repeat(pa.scalar(partition, pa.int32()), n),
                   message_ids, pc.add(pc.shift_left(pa.array(self.entry_ns, pa.int64()), POSITION_SHIFT),
                                       pc.add(pa.array(self.batches, pa.int64()), 1)),
                   pa.repeat(pa.scalar(gen, pa.int64()), n), pa.array(self.keys, pa.string()),
                   pa.array(self.values, pa.binary()), published, pa.array(self.properties, pa.string()),
                   pc.if_else(pc.equal(event_times, 0), None, event_times),  # 0: the producer set none
                   _time_errors(n, event_errors, published_errors),
                   pa.nulls(n, pa.int64())]  # watermark_bound: set by the source for event time (clock.py)
        return pa.RecordBatch.from_arrays(columns, schema=arrow_schema())


def _held_times(values: list[int], name: str) -> tuple:
    """A message time column (epoch ms as the client gives them: unsigned 64-bit) as int64, with
    each value past ``wire.MAX_TIME_MS`` (the end of the year 9999) null instead, and the errors
    of those rows by row index.

    Pulsar's event and publish times are unsigned 64-bit on the wire, so a producer can send
    any of them (an event time of 2**64-1 is a Java producer's -1): no value may fail the batch.
    Beyond the year 9999 no sink could hold it (wire.py), and a Spark timestamp (microseconds in
    a long) not much further. Checked column-wise: the read loop stays as it is.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        raw = pa.array(values, pa.uint64())
    except (OverflowError, pa.ArrowException):  # the client gave something else: sort it out one by one
        raw = pa.array([v if isinstance(v, int) and 0 <= v < 1 << 64 else 1 << 63 for v in values], pa.uint64())
    unheld = pc.greater(raw, pa.scalar(MAX_TIME_MS, pa.uint64()))
    if not pc.any(unheld).as_py():
        return raw.cast(pa.int64()), {}
    rows = pc.indices_nonzero(unheld).to_pylist()
    errors = {i: f"message {name} {values[i]} is outside the times the job can hold (epoch milliseconds "
                 f"up to {MAX_TIME_MS}, the end of the year 9999)" for i in rows}
    return pc.if_else(unheld, None, raw.cast(pa.int64(), safe=False)), errors


def _time_errors(n: int, *errors: dict[int, str]):
    """The ``time_error`` column: per row, what :func:`_held_times` found, ``"; "``-joined, or None."""
    import pyarrow as pa

    if not any(errors):
        return pa.nulls(n, pa.string())
    texts: list[str | None] = [None] * n
    for found in errors:
        for i, text in found.items():
            texts[i] = text if texts[i] is None else f"{texts[i]}; {text}"
    return pa.array(texts, pa.string())


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
    """The messages after a start id through an end id, each once, from a reader on its own
    connection that is reopened if it stalls.

    pulsar-lite 0.2.0 sometimes stops feeding a reader (or sends entries again) when other
    readers have used its connection, which a reused Python worker's shared client always
    has. So each range gets a connection of its own (a few milliseconds to open here), and
    since a committed range is known to exist, a reader that still goes silent is reopened on
    a fresh connection right after the last message it gave.
    """

    STALL_S = 1.5

    def __init__(self, service_url: str, name: str, topic: str, start_id: str, end_id: str, start_n: int,
                 timeout_s: float, ledgers: LedgerFacts | None = None):
        self.service_url, self.name, self.topic = service_url, name, topic
        self.start_id, self.end_id = start_id, end_id
        self.end = through(end_id)
        # Messages up to here were read: a start that covers a whole entry skips every message of
        # it, as the reader's own start does.
        self.last = self._start = client_message_id(start_id, after_whole_entry=True)
        self.entry_n = start_n  # the position of the entry being read
        # Where the last read stopped: its entry, the batch index of its last message, and in the
        # end entry, the batch index of the range's last message.
        self.ledger = self.entry = None
        self.previous_batch = 1 << 62  # the first message read starts an entry
        self.in_end_entry, self.last_index = False, self.end[2]
        self.done = start_id != EARLIEST and through(start_id) >= self.end
        # where the read starts, as (ledger, entry): a first message in a later ledger means this
        # one holds nothing after it (offsets.plan_entries learns ledgers' ends this way)
        self.ledgers = ledgers if ledgers is not None else LedgerFacts()
        start = None if start_id == EARLIEST else Position.parse(start_id)
        self.start_place = (-1, -1) if start is None else (start.ledger, start.entry)
        self.deadline = time.monotonic() + timeout_s
        self.client, self.reader = open_on_own_connection(service_url, name, start_id, RANGE_RECEIVER_QUEUE)

    def read(self, count: int) -> _Block:
        """Up to ``count`` messages not seen yet, fewer once the end is reached (``done``); it
        raises if the deadline passes first."""
        import pulsar

        block = _Block()
        ledgers, entries, batches, entry_ns, keys, values, published, event_times, properties = (
            block.ledgers, block.entries, block.batches, block.entry_ns, block.keys, block.values, block.published,
            block.event_times, block.properties)
        # This loop is the source's whole cost (each call into pulsar-client costs about half a
        # microsecond), so it calls the C++ reader under pulsar-client's Python wrapper directly
        # and keeps every lookup local.
        read_next = self.reader._reader.read_next
        last, got, entry_n = self.last, 0, self.entry_n
        end_ledger, end_entry, end_batch = self.end
        ledger, entry, previous_batch = self.ledger, self.entry, self.previous_batch
        in_end_entry, last_index = self.in_end_entry, self.last_index
        quiet_since = time.monotonic()
        while got < count:
            try:
                message = read_next(250)
            except pulsar.Timeout:
                if in_end_entry and last_index == LAST_INDEX and not self.reader.has_message_available():
                    self.done = True  # the end entry's size was not known, and nothing comes after it
                    break
                now = time.monotonic()
                if now > self.deadline:
                    raise SourceError(f"timed out re-reading committed messages of {self.topic!r} "
                                      f"through {self.end_id}; is the broker up?") from None
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
            # A message's batch index says when a new entry starts (0 or -1, or lower than the last
            # one's); only then are the ledger and entry asked for, once an entry.
            batch = found.batch_index()
            if batch <= 0 or batch <= previous_batch:
                at = found.ledger_id(), found.entry_id()
                was = (ledger, entry) if ledger is not None else self.start_place
                if at[0] > was[0]:  # a new ledger: the one before holds nothing after ``was``
                    self.ledgers.passed(was[0], was[1], at[0])
                if at > (end_ledger, end_entry):  # past the range (its end was read)
                    self.done = True
                    break
                if at != (ledger, entry):
                    entry_n += 1
                ledger, entry = at
                in_end_entry = (ledger, entry) == (end_ledger, end_entry)
                if in_end_entry and end_batch == WHOLE_ENTRY:
                    # a producer's id may not say its entry's size: then read until the broker has no more
                    last_index = ((message_batch_size(found) or LAST_INDEX + 1) - 1) if batch >= 0 else -1
            previous_batch = batch
            last = found
            try:
                key, props = message.partition_key() or None, message.properties()
            except UnicodeDecodeError:  # rare: bytes that are not UTF-8, read the careful way
                key, props_json = read_key_and_properties(message)
            else:
                props_json = json.dumps(props, sort_keys=True) if props else None
            ledgers.append(ledger)
            entries.append(entry)
            batches.append(batch)
            entry_ns.append(entry_n)
            keys.append(key)
            properties.append(props_json)
            values.append(message.data())
            published.append(message.publish_timestamp())
            event_times.append(message.event_timestamp())
            got += 1
            if in_end_entry and batch >= last_index:  # the range's last message
                self.done = True
                break
        self.last, self.entry_n = last, entry_n
        self.ledger, self.entry, self.previous_batch = ledger, entry, previous_batch
        self.in_end_entry, self.last_index = in_end_entry, last_index
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
        # a time the message carried that the row cannot hold (its column is None then), named
        # with its value: "message event_time 18446744073709551615 is outside …"; else None
        ("time_error", pa.string()),
        # the most this row's time may count for the event-time watermark, or None: it counts
        # for none (option clockFile, pipeline/source/clock.py)
        ("watermark_bound", pa.int64()),
    ])


SPARK_SCHEMA = ("kind string, topic string, partition int, message_id string, position long, generation long, "
                "key string, value binary, publish_time timestamp, properties string, event_time long, "
                "time_error string, watermark_bound long")
SPARK_SCHEMA_NAMES = [column.split()[0] for column in SPARK_SCHEMA.split(", ")]


CLOCK_KIND = "clock"  # the kind of a clock row: no topic's (datasource.py, option clockFile)


def clock_row(clock_ms: int):
    """The one row that carries the event-time clock to the watermark when it moved (a quiet
    stream has no other row to carry it): event time ``clock_ms``, counting whole, no key, no
    value, an id no message has (``clock:<ms>``); every other column None."""
    import pyarrow as pa

    schema = arrow_schema()
    values = {"kind": CLOCK_KIND, "partition": -1, "message_id": f"{CLOCK_KIND}:{clock_ms}",
              "position": 0, "generation": 0, "event_time": int(clock_ms), "watermark_bound": int(clock_ms)}
    return pa.RecordBatch.from_pylist([{name: values.get(name) for name in schema.names}], schema=schema)
