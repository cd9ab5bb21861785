"""``pulsar``: a PySpark 4 streaming data source over Pulsar topics, with exact re-reads.

Name: ``pulsar`` (register with ``spark.dataSource.register(PulsarDataSource)``).

Schema (one row per message)::

    kind string          logical topic name given in the ``topics`` option (users, items, orders)
    topic string         full Pulsar topic name
    partition int        partition index, -1 for a non-partitioned topic
    message_id string    ledger:entry:partition:batch
    position long        orders the messages of a partition and generation (entry position << 20 | batch index + 1)
    generation long      replay generation of its topic (0 until the first replay)
    key string           message key (None if the producer gave none)
    value binary         raw payload
    publish_time timestamp
    properties string    message properties as a JSON object, or None

Options:

- ``service_url`` (required): ``pulsar://host:6650``.
- ``topics`` (required): ``users=persistent://public/default/users,orders=…``.
- ``maxRowsPerBatch``: most broker *entries* in one micro-batch, shared fairly among partitions
  (``maxEntriesPerBatch`` overrides it). The driver plans without reading messages, so it
  knows entries, not messages: a batch holds at most this many entries, which is this many
  rows when producers do not batch, and up to this many times the producers' batch size (our
  producers: 1,000 messages an entry) when they do. A partition whose newest entry is in a
  later ledger than its position (Apache Pulsar rolls ledgers) also reads the rest of the older
  ledger, uncounted, in the batch that crosses it.
- ``maxEntriesPerBatch``: the same bound, named for what it counts.
- ``startingOffsets``: ``earliest`` (default), or JSON like ``{"orders": "latest"}``.
- ``controlDir``: folder of replay requests (``<seq>.json`` with ``topic`` and ``from``).
- ``splitRows``: a partition's entries in one batch are read as Spark partitions of at most this
  many entries (default 10,000).
- ``readTasks``: a batch is cut into about this many read tasks (default: twice the driver
  host's cores), so one busy topic partition still keeps every core reading and parsing; a
  task never holds less than one entry.

Guarantees: offsets are per-partition message ids with entry positions, so any micro-batch is
re-read exactly (no gap, no repeat) after a crash; a replay switches a topic to a new
generation inside the offset itself, so it is deterministic across crashes too. Planning a
batch costs one ``get_last_message_id`` per partition on the driver; it never reads a message
(a replay from a time scans once for its base). The latest offset reported (the backlog) is
exact, in entries.

Example::

    spark.dataSource.register(PulsarDataSource)
    df = (spark.readStream.format("pulsar")
          .option("service_url", "pulsar://127.0.0.1:6650")
          .option("topics", "orders=persistent://public/default/orders")
          .option("maxRowsPerBatch", 10000).load())
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from pipeline.errors import SourceError
from pipeline.source import offsets as off
from pipeline.source import probes
from pipeline.source import reader as rd

log = logging.getLogger(__name__)
PARTITION_REFRESH_S = 10.0
SPLIT_ROWS = 10_000  # a partition's entries in one batch are read (and parsed) in pieces of about this


def parse_topics_option(text: str | None) -> dict[str, str]:
    """``kind=topic,…`` -> {kind: topic}; checked on the driver."""
    if not text:
        raise SourceError("option 'topics' is required, e.g. 'orders=persistent://public/default/orders'")
    topics = {}
    for pair in text.split(","):
        kind, sep, topic = pair.strip().partition("=")
        if not sep or not kind or "://" not in topic:
            raise SourceError(f"option 'topics' entry {pair!r} is not of the form kind=persistent://tenant/ns/topic")
        topics[kind.strip()] = topic.strip()
    return topics


def parse_starting_offsets(text: str | None, kinds: list[str]) -> dict[str, str]:
    if not text or text == off.EARLIEST:
        return {kind: off.EARLIEST for kind in kinds}
    if text == "latest":
        return {kind: "latest" for kind in kinds}
    try:
        given = json.loads(text)
    except ValueError:
        raise SourceError(f"option 'startingOffsets' = {text!r} is not 'earliest', 'latest' or a JSON object") from None
    bad = {k: v for k, v in given.items() if k not in kinds or v not in (off.EARLIEST, "latest")}
    if bad:
        raise SourceError(f"option 'startingOffsets' has bad entries {bad!r}; keys are {kinds}, values earliest|latest")
    return {kind: given.get(kind, off.EARLIEST) for kind in kinds}


class PulsarPartition(InputPartition):
    def __init__(self, kind: str, topic: str, rng: off.Range):
        super().__init__((kind, topic))
        self.kind, self.topic, self.rng = kind, topic, rng


def _whole_number(options: dict, name: str) -> int | None:
    """A positive whole-number option (None when absent, empty or 0)."""
    raw = options.get(name)
    if raw in (None, "", "0"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise SourceError(f"option {name!r} = {raw!r} is not a whole number") from None
    if value < 1:
        raise SourceError(f"option {name!r} = {raw!r} must be >= 1")
    return value


class PulsarStreamReader(DataSourceStreamReader):
    """Plans batches on the driver (newest entry ids, no reading) and reads them on executors (read_range)."""

    def __init__(self, options: dict):
        self.service_url = options.get("service_url") or ""
        if not self.service_url.startswith(("pulsar://", "pulsar+ssl://")):
            raise SourceError(f"option 'service_url' = {self.service_url!r} must be a pulsar:// URL")
        self.topics = parse_topics_option(options.get("topics"))
        self.max_rows = _whole_number(options, "maxEntriesPerBatch") or _whole_number(options, "maxRowsPerBatch")
        self.split_rows = _whole_number(options, "splitRows") or SPLIT_ROWS
        self.read_tasks = _whole_number(options, "readTasks") or 2 * (os.cpu_count() or 1)
        self.starting = parse_starting_offsets(options.get("startingOffsets"), list(self.topics))
        self.control_dir = Path(options["controlDir"]) if options.get("controlDir") else None
        self._latest: dict[tuple[str, str], tuple[int, int, str]] = {}  # (kind, p) -> (gen, n, id) newest seen
        self._partitions: dict[str, list[str]] = {}
        self._partitions_at = 0.0

    # ------------------------------------------------------------------ driver side
    def _topic_partitions(self) -> dict[str, list[str]]:
        if not self._partitions or time.monotonic() - self._partitions_at > PARTITION_REFRESH_S:
            self._partitions = {kind: probes.list_partitions(self.service_url, topic) for kind, topic in self.topics.items()}
            self._partitions_at = time.monotonic()
        return self._partitions

    def initialOffset(self) -> dict:
        parts = self._topic_partitions()
        offset = off.initial_offset(parts)
        for kind, how in self.starting.items():
            if how == "latest":  # after the newest entry of each partition, per partition
                ids = {p: probes.last_entry_id(self.service_url, self.topics[kind], p) or off.EARLIEST for p in parts[kind]}
                offset[kind]["base"] = dict(ids)
                offset[kind]["parts"] = {p: {"n": 0, "id": i} for p, i in ids.items()}
        return offset

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next batch: each partition's newest entry, capped at ``limit`` entries
        shared fairly. One ``get_last_message_id`` per partition; no message is read."""
        offset = off.with_partitions(start, self._topic_partitions())
        offset = self._apply_replay_requests(offset)
        available: dict[str, int] = {}
        plans: dict[str, tuple[int, int]] = {}
        for kind, topic_offset in offset.items():
            if start.get(kind, {}).get("gen", topic_offset["gen"]) != topic_offset["gen"]:
                log.info("replay of %s generation %s starts at %s", kind, topic_offset["gen"], topic_offset["base"])
            for p, part in topic_offset["parts"].items():
                last = probes.last_entry_id(self.service_url, self.topics[kind], p)
                try:
                    ledger, first, count = off.plan_entries(part["id"], last)
                except ValueError as exc:
                    raise SourceError(f"{kind} ({self.topics[kind]!r}) partition {p}: {exc}") from None
                plans[f"{kind}\x00{p}"], available[f"{kind}\x00{p}"] = (ledger, first), count
                self._latest[(kind, p)] = (topic_offset["gen"], part["n"] + count, last if count else part["id"])
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = json.loads(json.dumps(offset))
        for key, grant in off.allocate(available, max_rows).items():
            if grant:
                kind, p = key.split("\x00")
                ledger, first = plans[key]
                part = end[kind]["parts"][p]
                part["n"] += grant
                part["id"] = off.entry_end(ledger, first + grant - 1, p)
        return end

    def reportLatestOffset(self) -> dict | None:
        """The newest entry of every partition at the last planning, with its position (the backlog)."""
        if not self._latest:
            return None
        latest: dict = {}
        for (kind, p), (gen, n, last) in self._latest.items():
            topic = latest.setdefault(kind, {"gen": gen, "parts": {}})
            topic["parts"][p] = {"n": n, "id": last}
        return latest

    def _apply_replay_requests(self, offset: dict) -> dict:
        """Switch a changelog topic to a new generation when a newer replay request exists."""
        if self.control_dir is None or not self.control_dir.is_dir():
            return offset
        for path in sorted(self.control_dir.glob("*.json")):
            try:
                request = json.loads(path.read_text())
                seq, kind = int(request["seq"]), request["topic"]
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("ignoring unreadable replay request %s", path)
                continue
            if kind not in offset or seq <= offset[kind]["gen"]:
                continue
            parts = list(offset[kind]["parts"])
            topic = self.topics[kind]
            from_ms = request.get("from_ms")
            bases = {p: (off.EARLIEST if from_ms is None else probes.find_position_before(self.service_url, topic, p, int(from_ms)))
                     for p in parts}
            replayed = off.empty_topic_offset(parts, gen=seq)
            replayed["base"] = bases
            replayed["parts"] = {p: {"n": 0, "id": bases[p]} for p in parts}
            replayed["target"] = {p: t for p in parts if (t := probes.last_entry_id(self.service_url, topic, p))}
            offset[kind] = replayed
        return offset

    def partitions(self, start: dict, end: dict):
        ranges = off.ranges_between(start or {}, end)
        # about read_tasks pieces in all, each range cut in proportion to its entries
        chunk = min(self.split_rows, max(1, -(-sum(r.count for r in ranges) // self.read_tasks)))
        pieces = []
        for rng in ranges:
            pieces.extend(off.split_range(rng, off.entry_id_at(rng), chunk))
        return [PulsarPartition(r.topic, self.topics[r.topic], r) for r in pieces]

    def commit(self, end: dict) -> None:
        """Nothing to acknowledge: readers are non-durable, and retention keeps the changelogs."""

    # ------------------------------------------------------------------ executor side
    def read(self, partition: PulsarPartition):
        return rd.read_range(self.service_url, partition.topic, partition.kind, partition.rng)


class PulsarDataSource(DataSource):
    """The ``pulsar`` streaming source (see the module docstring for schema and options)."""

    @classmethod
    def name(cls) -> str:
        return "pulsar"

    def schema(self) -> str:
        return rd.SPARK_SCHEMA

    def streamReader(self, schema) -> PulsarStreamReader:
        return PulsarStreamReader(self.options)
