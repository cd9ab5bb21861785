"""Offsets of the Pulsar source: small JSON dicts of per-partition message positions.

An offset names, for each logical topic, its replay generation and, for each partition, the
last message consumed: its id and its position ``n``. Spark stores offsets in its write-ahead
log, so a batch between two offsets is re-read exactly after a crash.

Batches end on whole broker *entries*: the driver plans a batch from the id of each partition's
newest entry alone (one ``get_last_message_id``) and what earlier reads found out about the
partition's ledgers (:func:`plan_entries`), and never reads a message. So ``n`` counts
entries of this generation (planned ones: a range planned past the end of a ledger not known yet
holds fewer), not messages: a batching producer puts many messages in one entry
(pulsar-client's defaults: up to 1,000 messages or 128 KB), an unbatched one puts one. The
messages a batch read are counted where they are read (the job's observed metrics), not here.

An id ``ledger:entry:partition:-1`` as an end means "through the whole of that entry"; an id
with a batch index (a replay's time base, a ``latest`` start) means "through that very
message". Either way the messages of a batch are those with ids in (start, end], in the order of
the partition (:func:`through` compares them), and entries never change, so a re-read is exact.

```
{"users":  {"gen": 0, "base": {"-1": "earliest"}, "target": {},
            "parts": {"-1": {"n": 1200, "id": "0:17:-1:3"}}},
 "items":  {...}, "orders": {...}}
```

- ``gen`` is the sequence number of the last replay request applied to that topic (0: none).
  A new generation restarts the topic at ``base`` (earliest, or the message before a time).
- ``target`` holds, for a replay, the id of the newest message when the replay began; the
  replay has finished once ``parts`` reach it.
- Message ids are ``ledger:entry:partition:batch`` like Java's ``MessageId.toString()``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

EARLIEST = "earliest"


@dataclass(frozen=True, order=True)
class Position:
    """A message id as comparable integers; ``batch`` is -1 for an unbatched message."""

    ledger: int
    entry: int
    partition: int
    batch: int

    @classmethod
    def parse(cls, text: str) -> "Position":
        try:
            ledger, entry, partition, batch = (int(part) for part in text.split(":"))
        except (ValueError, AttributeError):
            raise ValueError(f"message id {text!r} is not of the form ledger:entry:partition:batch") from None
        return cls(ledger, entry, partition, batch)

    def __str__(self) -> str:
        return f"{self.ledger}:{self.entry}:{self.partition}:{self.batch}"

    @property
    def through(self) -> tuple[int, int, int]:
        """The id as the last message it covers: batch -1 covers its whole entry."""
        return (self.ledger, self.entry, self.batch if self.batch >= 0 else WHOLE_ENTRY)


WHOLE_ENTRY = 1 << 62  # sorts after every batch index
BEFORE_ALL = (-1, -1, WHOLE_ENTRY)  # where "earliest" is


def through(text: str) -> tuple[int, int, int]:
    """:attr:`Position.through` of an id text, or the place before every message for EARLIEST.

    A message ``(ledger, entry, batch)`` is in (start, end] iff ``through(start) <
    (ledger, entry, batch or WHOLE_ENTRY) <= through(end)``.
    """
    return BEFORE_ALL if text == EARLIEST else Position.parse(text).through


# Entries an unknown ledger is planned as: a batch takes what its caps allow of it, and a read
# of a range that ends past the ledger's real end stops at it (reads are bounded by ids).
OPEN_LEDGER = 1 << 40


@dataclass(frozen=True)
class Segment:
    """Entries of one ledger a partition holds after a start: ``first`` to ``first + count - 1``
    (``count`` is :data:`OPEN_LEDGER` where the ledger's end is not known yet)."""

    ledger: int
    first: int
    count: int


def plan_entries(start_id: str, last_id: str | None, ledgers: dict | None = None) -> list[Segment]:
    """What a partition holds after ``start_id`` when its newest entry is ``last_id``: its entries
    ledger by ledger, in order ([] when it holds nothing).

    Exact within the newest ledger. A broker starts a new ledger now and then (pulsar-lite every
    50,000 entries, Apache Pulsar by size and time), and an id says nothing of where an earlier
    ledger ended, so earlier ledgers are counted from what reads found (``ledgers``: ``{"ends":
    {ledger: last entry}, "next": {ledger: the ledger after it}}``, ledger -1 being the place
    before the first, as :func:`pipeline.source.planning.record_ledgers` keeps them). The walk
    stops at the first ledger whose end is not known yet: it is one open segment, so a batch never
    admits past it, and the read that reaches its end records it for the next batch. Which ledger
    is a partition's first is found by a probe (``datasource.ProbePartition``) before its first
    batch; without one, the ledgers before the newest ride uncounted with its entries.
    """
    if last_id is None:
        return []
    last = Position.parse(last_id)
    ends = {int(k): int(v) for k, v in ((ledgers or {}).get("ends") or {}).items()}
    following = {int(k): int(v) for k, v in ((ledgers or {}).get("next") or {}).items()}
    if start_id == EARLIEST:
        ledger, first = -1, 0
    else:
        start = Position.parse(start_id)
        if (start.ledger, start.entry) > (last.ledger, last.entry):
            raise ValueError(f"position {start_id!r} is past the newest entry {last_id!r}; "
                             "was the topic truncated or recreated?")
        # a start inside an entry (a batch index) leaves the rest of that entry to read
        ledger, first = start.ledger, (start.entry if start.batch >= 0 else start.entry + 1)
    segments = []
    if ledger == -1 and -1 not in following:
        # which ledger comes first is not known (a probe finds it, datasource.py): the earlier
        # ledgers, if any, ride uncounted with the newest one's entries
        ledger = last.ledger
    while ledger < last.ledger:
        if ledger not in following and -1 in following and ledger < following[-1]:
            ledger, first = following[-1], 0  # a start before the first ledger (a range that found none)
            continue
        if ledger not in following:
            segments.append(Segment(ledger, first, OPEN_LEDGER))
            return segments
        if ledger >= 0 and ends.get(ledger, -1) >= first:
            segments.append(Segment(ledger, first, ends[ledger] - first + 1))
        ledger, first = following[ledger], 0
    if ledger == last.ledger and last.entry >= first:
        segments.append(Segment(ledger, first, last.entry - first + 1))
    return segments


def available_entries(segments: list[Segment]) -> int:
    return sum(segment.count for segment in segments)


def end_after(segments: list[Segment], grant: int) -> tuple[int, int]:
    """(ledger, entry) of the ``grant``-th entry of ``segments`` (1-based)."""
    for segment in segments:
        if grant <= segment.count:
            return segment.ledger, segment.first + grant - 1
        grant -= segment.count
    raise ValueError("grant past the segments")


def entry_end(ledger: int, entry: int, partition: str) -> str:
    """The end id that covers a whole entry."""
    return f"{ledger}:{entry}:{int(partition)}:-1"


def empty_topic_offset(partitions: list[str], base: str = EARLIEST, gen: int = 0) -> dict:
    """The offset of a topic nobody has read yet (or that a replay restarts)."""
    return {"gen": gen, "base": {p: base for p in partitions}, "target": {},
            "parts": {p: {"n": 0, "id": base} for p in partitions}}


def initial_offset(topic_partitions: dict[str, list[str]], bases: dict[str, str] | None = None) -> dict:
    """The first offset: every partition of every topic before its first message (or at ``bases``)."""
    bases = bases or {}
    return {topic: empty_topic_offset(parts, bases.get(topic, EARLIEST)) for topic, parts in topic_partitions.items()}


def with_partitions(offset: dict, topic_partitions: dict[str, list[str]]) -> dict:
    """The offset extended with partitions (or topics) that appeared since; those start at earliest."""
    result = copy.deepcopy(offset)
    for topic, parts in topic_partitions.items():
        entry = result.setdefault(topic, empty_topic_offset([]))
        for p in parts:
            if p not in entry["parts"]:
                entry["base"][p] = EARLIEST
                entry["parts"][p] = {"n": 0, "id": EARLIEST}
    return result


def with_tick(offset: dict) -> dict:
    """The offset with one more ``tick`` (in its first topic's offset): a batch that reads no
    message but must run (datasource option ``tickForMs``), and runs the same when re-run.

    # {"orders": {"gen": 0, …}} -> {"orders": {"gen": 0, …, "tick": 1}}
    """
    result = copy.deepcopy(offset)
    first = result[min(result)]
    first["tick"] = int(first.get("tick", 0)) + 1
    return result


def tick_due(now: float, read_ended: float, last_tick: float, tick_for: float, tick_every: float) -> bool:
    """Whether a source with nothing to read plans a batch of no row now (options ``tickForMs``,
    ``tickEveryMs``; seconds here, monotonic): one every ``tick_every`` (0: every trigger) after
    ``read_ended``, when the last batch that read messages ended, until one lands at or past
    ``tick_for`` after it; ``last_tick``: when the last one was planned (``read_ended`` if none).

    # tick_for 5, tick_every 0 (each trigger): due at 0.5, 1, …, 5 s after read_ended; not at 5.5
    # tick_for 5, tick_every 5 (once): due at the first trigger at or past 5 s, then no more
    """
    return bool(tick_for) and last_tick - read_ended < tick_for and now - last_tick >= tick_every


@dataclass(frozen=True)
class Range:
    """The messages of one partition in one batch: after ``start_id`` through ``end_id``
    (entries ``start_n`` to ``end_n`` of the generation; ``count`` entries)."""

    topic: str
    partition: str
    gen: int
    start_id: str
    start_n: int
    end_id: str
    end_n: int

    @property
    def count(self) -> int:
        return self.end_n - self.start_n


def ranges_between(start: dict, end: dict) -> list[Range]:
    """The non-empty per-partition ranges of the batch (start, end]."""
    ranges = []
    for topic, end_topic in end.items():
        start_topic = start.get(topic)
        new_generation = start_topic is None or start_topic["gen"] != end_topic["gen"]
        for p, end_part in end_topic["parts"].items():
            if new_generation or p not in start_topic["parts"]:
                begin = {"n": 0, "id": end_topic["base"].get(p, EARLIEST)}
            else:
                begin = start_topic["parts"][p]
            if end_part["n"] > begin["n"]:
                ranges.append(Range(topic, p, end_topic["gen"], begin["id"], begin["n"], end_part["id"], end_part["n"]))
    return ranges


def entry_id_at(rng: Range):
    """``id_at(n)`` for :func:`split_range` from entry arithmetic: the end of the entry at
    position n of a range that ends on a whole entry (None where that is not known).

    Only a range that starts after a known id in the ledger of its end is cut: a range over
    ledgers may hold fewer entries than planned (a ledger's end is learnt by reading it,
    :func:`plan_entries`), and a read numbers every entry it meets, so a cut there could give
    two pieces the same positions and misorder a key's changes.
    """
    end = None if rng.end_id == EARLIEST else Position.parse(rng.end_id)
    whole = (end is not None and end.batch < 0 and rng.start_id != EARLIEST
             and Position.parse(rng.start_id).ledger == end.ledger)

    def id_at(n: int) -> str | None:
        if not whole:  # an end inside an entry, or a range over ledgers: keep the range whole
            return None
        entry = end.entry - (rng.end_n - n)
        return entry_end(end.ledger, entry, rng.partition) if entry >= 0 else None
    return id_at


def split_range(rng: Range, id_at, chunk_rows: int) -> list[Range]:
    """Cut a range into consecutive pieces of about ``chunk_rows`` positions (entries) so
    executors read and parse them in parallel.

    ``id_at(n)`` gives the id that ends position n, or None when it is not known (then the
    range stays whole). Each piece re-reads exactly its messages, so the union is the range.
    """
    if chunk_rows < 1 or rng.count <= chunk_rows:
        return [rng]
    pieces = -(-rng.count // chunk_rows)
    cuts = [rng.start_n + (rng.count * i) // pieces for i in range(1, pieces)]
    ids = [id_at(n) for n in cuts]
    if any(found is None for found in ids):
        return [rng]
    bounds = [(rng.start_id, rng.start_n)] + list(zip(ids, cuts)) + [(rng.end_id, rng.end_n)]
    return [Range(rng.topic, rng.partition, rng.gen, a_id, a_n, b_id, b_n)
            for (a_id, a_n), (b_id, b_n) in zip(bounds, bounds[1:])]


def replay_finished(topic_offset: dict) -> bool:
    """Whether a replay generation has reached the newest message it had to re-read."""
    target = topic_offset.get("target") or {}
    for p, target_id in target.items():
        current = topic_offset["parts"].get(p, {}).get("id", EARLIEST)
        if through(current) < through(target_id):
            return False
    return True
