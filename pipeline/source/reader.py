"""Reading Pulsar partitions with non-durable readers: exact ranges of messages, once each.

- :func:`read_range` (executor): re-reads exactly the messages of one :class:`Range` and yields
  Arrow record batches. Called once per input partition per micro-batch, also after a crash.
- :func:`probe_first_ledger` (executor): the ledger of a partition's first message.

Clients and message ids are pipeline/source/connection.py's; the rows' schema is rows.py's.

Only the standard Pulsar protocol is used (readers from message ids; no seek, no
subscriptions), so the same code runs on pulsar-lite and Apache Pulsar.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from typing import Iterator

from pipeline.errors import SourceError
from pipeline.source.connection import (LAST_INDEX, client_message_id, close_quietly, id_text, open_on_own_connection,
                                        partition_topic)
from pipeline.source.offsets import EARLIEST, WHOLE_ENTRY, Position, Range, through
from pipeline.source.rows import MessageColumns

log = logging.getLogger(__name__)
# Rows of one Arrow record batch a read task yields: 32k against 8k gave 7% more rows/s in the
# stateless step (fewer hand-overs to the JVM and parse calls); 64k no more (bench/README, stop 22).
ARROW_BATCH_ROWS = 32768
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

    def read(self, count: int) -> MessageColumns:
        """Up to ``count`` messages not seen yet, fewer once the end is reached (``done``); it
        raises if the deadline passes first."""
        import pulsar

        block = MessageColumns()
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
