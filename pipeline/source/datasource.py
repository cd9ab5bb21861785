"""``pulsar``: a PySpark 4 streaming data source over Pulsar topics, with exact re-reads.

Name: ``pulsar`` (register with ``spark.dataSource.register(PulsarDataSource)``).

Schema: one row per message, as pipeline/source/rows.py describes it.

Options:

- ``service_url`` (required): ``pulsar://host:6650``.
- ``topics`` (required): ``users=persistent://public/default/users,orders=…``.
- ``maxRowsPerBatch``: most *messages* in one micro-batch, whatever the producers' batching;
  ``maxBytesPerBatch``: most bytes (the source's Arrow rows: payload, key, properties, ids). The
  driver plans whole broker entries from their ids alone (an unbatched message is one entry, a
  batching producer puts up to 1,000 in one), so both caps are estimates: each partition's
  entries are priced from what its last range held when read (pipeline/source/planning.py).
- ``changelogs``: kinds read first (``users,items``): a batch admits the other kinds only once
  every partition of these is admitted up to the newest entry it had when the batch was planned,
  and the others' newest entries are asked first. ``shareAfter`` (default 10): after that many
  batches in a row that the changelogs filled while others waited, the others get a fair share.
  A changelog being replayed shares fairly from the start.
- ``clockFile``: the event-time clock a driver keeps (pipeline/source/clock.py): each
  changelog partition's newest event time, which are idle, and the batch it has taken in. Each
  batch's end offset carries those facts (``newest_ms``, ``idle`` per changelog partition), so
  a re-read batch carries the same; every row gets its ``watermark_bound`` from them; and when
  the clock has moved with no new message the source still plans a batch, with one row of kind
  ``clock`` at the clock's time (no key or value), so a quiet stream's watermark moves too.
- ``tickForMs``: how long after a batch that read messages the source still plans batches
  with no row when there is nothing to read (each one's end offset counts a ``tick``), one each
  trigger, or one each ``tickEveryMs`` (the last at or past ``tickForMs``: with both equal, one
  batch); 0 or absent: never. A query whose operators keep processing-time timers sets it to the
  longest a timer waits (plus a trigger or two) and turns Spark's own no-data batches off
  (pipeline/runtime/spark.py ``start_without_idle_batches``): those run every trigger for good,
  input or not, while a timer is due at most that long after the batch that set it.
- ``statsDir``: a folder where read tasks record what each partition's entries hold, for the
  estimates above (without it every batch is planned with the cold guess).
- ``startingOffsets``: ``earliest`` (default), or JSON like ``{"orders": "latest"}``.
- ``authToken``: a JWT for a Pulsar with token authentication (``pulsar.auth_token``); Spark
  redacts it from plans and its UI, as it does any option whose name says "token".
- ``controlDir``: folder of replay requests (``<seq>.json`` with ``topic`` and ``from``).
- ``splitRows``: a partition's share of one batch is read as Spark partitions of about this
  many messages (default 10,000), so one busy topic partition still keeps every core parsing.
- ``transform``: ``module:function`` run in each read task on its Arrow record batches (an
  iterator in, an iterator out), with ``transformArgs`` (a JSON object) as keyword arguments;
  declare what it yields with ``.schema(…)``. A parse step given here runs in the task that
  read the messages, so rows go from Python to Spark once instead of out, back and out again
  (``mapInArrow`` after the source): measured 15-20% more rows/s with the job's parse step.

Guarantees: offsets are per-partition message ids (ends on whole entries) with entry
positions, so any micro-batch is re-read exactly (no gap, no repeat) after a crash; a replay
switches a topic to a new generation inside the offset itself, so it is deterministic across
crashes too. Planning a batch reads no message: per partition, the driver asks the broker for
its newest entry (one ``get_last_message_id``) and plans whole entries up to it. Each topic's end
offset also says what the batch admitted (``admitted``: entries, and messages and bytes as
estimated) and, for kinds read after the changelogs, ``held_for`` and ``shared``
(pipeline/source/planning.py).

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
import time
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from pipeline.errors import SourceError
from pipeline.runtime.freed_memory import give_back_freed_memory
from pipeline.source import clock as clk
from pipeline.source import offsets as off
from pipeline.source import connection, planning, probes, rows
from pipeline.source import reader as rd
from pipeline.source.options import load_transform, parse_starting_offsets, parse_topics_option, whole_number

log = logging.getLogger(__name__)
PARTITION_REFRESH_S = 10.0
SPLIT_ROWS = 10_000  # a partition's messages in one batch are read (and parsed) in pieces of about this
MAX_PROBES = 3  # probes for a partition's first ledger before it is read without knowing it
SHARE_AFTER = 10  # batches the changelogs may fill in a row before the other kinds get a share
CLOCK_WAIT_S = 1.0  # how long planning waits for the driver's clock to take in the batch before
BOUND_INDEX = rows.SPARK_SCHEMA_NAMES.index("watermark_bound")
BOUND_FIELD = "watermark_bound"


class PulsarPartition(InputPartition):
    """A range of one topic partition's messages, with the watermark bound of its rows and, on
    one piece of a batch whose clock moved, the clock row to yield after them (option clockFile)."""

    def __init__(self, kind: str, topic: str, rng: off.Range, bound: int | None = None, clock_ms: int | None = None):
        super().__init__((kind, topic))
        self.kind, self.topic, self.rng, self.bound, self.clock_ms = kind, topic, rng, bound, clock_ms


class ClockPartition(InputPartition):
    """The clock row of a batch that reads no message (option ``clockFile``)."""

    def __init__(self, clock_ms: int):
        super().__init__((rows.CLOCK_KIND, clock_ms))
        self.clock_ms = int(clock_ms)


class ProbePartition(InputPartition):
    """A read task that finds which ledger a partition's first message is in, and yields no row."""

    def __init__(self, kind: str, topic: str, partition: str):
        super().__init__(("probe", kind, partition))
        self.kind, self.topic, self.partition = kind, topic, partition


class PulsarStreamReader(DataSourceStreamReader):
    """Plans batches on the driver (newest entry ids) and reads them on executors (read_range)."""

    def __init__(self, options: dict, schema=None):
        self.service_url = options.get("service_url") or ""
        if not self.service_url.startswith(("pulsar://", "pulsar+ssl://")):
            raise SourceError(f"option 'service_url' = {self.service_url!r} must be a pulsar:// URL")
        self.topics = parse_topics_option(options.get("topics"))
        self.max_rows = whole_number(options, "maxRowsPerBatch")
        self.max_bytes = whole_number(options, "maxBytesPerBatch")
        self.split_rows = whole_number(options, "splitRows") or SPLIT_ROWS
        share_after = whole_number(options, "shareAfter", minimum=0)
        self.share_after = SHARE_AFTER if share_after is None else share_after
        self.changelogs = {kind.strip() for kind in (options.get("changelogs") or "").split(",") if kind.strip()}
        if self.changelogs - set(self.topics):
            raise SourceError(f"option 'changelogs' names {sorted(self.changelogs - set(self.topics))}, "
                              f"which are not in option 'topics' ({sorted(self.topics)})")
        self.stats_dir = options.get("statsDir") or None
        self.tick_for_s = (whole_number(options, "tickForMs", minimum=0) or 0) / 1000
        self.tick_every_s = (whole_number(options, "tickEveryMs", minimum=0) or 0) / 1000
        # when the last batch that read messages ended (its next planning): a timer it set is due
        # within tickForMs of it; a (re)started source counts from its start, for the timers of
        # batches before it. And when the last batch of no row was planned.
        self._read_ended, self._planned_read = time.monotonic(), False
        self._ticked = self._read_ended
        self.clock_file = options.get("clockFile") or None
        self._late_clocks, self._late_clock_said = 0, 0.0  # plans the driver's clock was late for
        self.starting = parse_starting_offsets(options.get("startingOffsets"), list(self.topics))
        self.control_dir = Path(options["controlDir"]) if options.get("controlDir") else None
        self.auth_token = options.get("authToken") or None
        connection.use_token(self.service_url, self.auth_token)
        self.transform = options.get("transform") or None
        self.transform_args = options.get("transformArgs") or None
        load_transform(self.transform, self.transform_args)  # a bad one fails here, in one line
        if not self.transform and schema is not None and schema.fieldNames() != rows.SPARK_SCHEMA_NAMES:
            raise SourceError(f"a schema was given ({schema.simpleString()}) but no 'transform' option; "
                              "the source's own rows have the schema in pipeline/source/rows.py")
        # (kind, partition) -> (generation, entry position, id) of the newest entry seen when planning
        self._latest: dict[tuple[str, str], tuple[int, int, str]] = {}
        self._partitions: dict[str, list[str]] = {}
        self._partitions_at = 0.0
        # (kind, partition) -> what one entry holds, as last planned with (read tasks' samples or a guess)
        self._sizes: dict[tuple[str, str], planning.EntrySize] = {}
        self._granted: dict[str, int] = {}  # per partition, the entries its last batch with any was granted

    def __setstate__(self, state):
        self.__dict__.update(state)
        connection.use_token(self.service_url, self.auth_token)  # a read task's own clients need it too

    # ------------------------------------------------------------------ driver side
    def _topic_partitions(self) -> dict[str, list[str]]:
        if not self._partitions or time.monotonic() - self._partitions_at > PARTITION_REFRESH_S:
            self._partitions = {kind: connection.list_partitions(self.service_url, topic) for kind, topic in self.topics.items()}
            self._partitions_at = time.monotonic()
        return self._partitions

    def initialOffset(self) -> dict:
        parts = self._topic_partitions()
        bases = {}
        for kind, how in self.starting.items():
            if how == "latest":
                # after the newest entry of each partition (a base covers its whole entry)
                ids = {p: probes.last_entry_id(self.service_url, self.topics[kind], p) or off.EARLIEST for p in parts[kind]}
                bases[kind] = ids
        offset = off.initial_offset(parts)
        for kind, ids in bases.items():
            offset[kind]["base"] = dict(ids)
            offset[kind]["parts"] = {p: {"n": 0, "id": i} for p, i in ids.items()}
        return offset

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next batch: whole entries per partition within the caps, changelogs
        first (pipeline/source/planning.py); ``start`` itself when there is nothing to read."""
        if self._planned_read:  # Spark plans a batch once the one before it has ended
            self._read_ended, self._planned_read = time.monotonic(), False
            self._ticked = self._read_ended
        offset = off.with_partitions(start, self._topic_partitions())
        offset = self._apply_replay_requests(offset)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        # Changelogs being replayed share fairly with the orders (README "Replay").
        first = {kind for kind in self.changelogs if off.replay_finished(offset[kind])}
        available: dict[str, int] = {}
        spans: dict[str, list[off.Segment]] = {}
        newest_sizes: dict[str, int | None] = {}
        ledgers = planning.read_ledgers(self.stats_dir)
        probes_due: list[tuple[str, str]] = []
        # The others' newest entries are asked before the changelogs': every message a batch
        # admits from them was published before the changelog entries it is planned with.
        for kind in sorted(offset, key=lambda k: (k in first, k)):
            topic_offset = offset[kind]
            if start.get(kind, {}).get("gen") != topic_offset["gen"]:
                log.info("replay of %s generation %s starts at %s", kind, topic_offset["gen"], topic_offset["base"])
            for p, part in topic_offset["parts"].items():
                last, newest_sizes[f"{kind}\x00{p}"] = probes.newest_entry(self.service_url, self.topics[kind], p)
                try:
                    span = off.plan_entries(part["id"], last, ledgers.get((kind, p)))
                except ValueError as exc:
                    raise SourceError(f"{self.topics[kind]!r} partition {p}: {exc}") from None
                key = f"{kind}\x00{p}"
                if self._needs_probe(part, last, ledgers.get((kind, p))):
                    probes_due.append((kind, p))
                    span = []  # nothing of it is admitted before its first ledger is known
                available[key], spans[key] = off.available_entries(span), span
                # the backlog shown counts the entries known (an open ledger's are not yet)
                known = sum(segment.count for segment in span if segment.count != off.OPEN_LEDGER)
                self._latest[(kind, p)] = (topic_offset["gen"], part["n"] + known, last or part["id"])
        samples = planning.read_sizes(self.stats_dir)
        sizes = {key: samples.get(tuple(key.split("\x00"))) or planning.cold_size(newest_sizes[key]) for key in available}
        self._sizes.update({tuple(key.split("\x00")): size for key, size in sizes.items()})
        held_for = max((offset[kind].get("held_for", 0) for kind in offset if kind not in self.changelogs), default=0)
        if max_rows is None and self.max_bytes is None:
            plan = planning.Plan(dict(available), 0, False)
        else:
            cost = {key: size.cost(max_rows, self.max_bytes) for key, size in sizes.items()}
            firsts = {key for key in available if key.split("\x00")[0] in first}
            plan = planning.plan_batch(planning.within_estimates(available, sizes, firsts, self._granted), cost, firsts,
                                       held_for, self.share_after)
            self._granted.update({key: grant for key, grant in plan.grants.items() if grant})
        if any(kind in first for kind, _ in probes_due):  # a changelog not planned yet: orders wait for it
            plan = planning.Plan({key: grant if key.split("\x00")[0] in first else 0 for key, grant in plan.grants.items()},
                                 held_for, False)
        end = json.loads(json.dumps(offset))
        clock_moved = self._take_clock(start, end)
        for kind, p in probes_due:
            end[kind]["parts"][p]["probe"] = end[kind]["parts"][p].get("probe", 0) + 1
        self._planned_read = any(plan.grants.values())
        if not (self._planned_read or clock_moved or probes_due):
            now = time.monotonic()
            if not off.tick_due(now, self._read_ended, self._ticked, self.tick_for_s, self.tick_every_s):
                return offset  # nothing to read, no clock to move, no probe, no timer due: Spark runs no batch
            end, self._ticked = off.with_tick(end), now  # a batch of no row, for the timers that may be due
        admitted = {kind: {"entries": 0, "messages": 0, "bytes": 0} for kind in end}
        for key, grant in plan.grants.items():
            if grant:
                kind, p = key.split("\x00")
                part = end[kind]["parts"][p]
                part["n"] += grant
                part["id"] = off.entry_end(*off.end_after(spans[key], grant), p)
                admitted[kind]["entries"] += grant
                admitted[kind]["messages"] += round(grant * sizes[key].messages)
                admitted[kind]["bytes"] += round(grant * sizes[key].bytes)
        for kind, topic_end in end.items():
            topic_end["admitted"] = admitted[kind]
            if self.changelogs and kind not in self.changelogs:
                topic_end["held_for"], topic_end["shared"] = plan.held_for, plan.shared
        return end

    def reportLatestOffset(self) -> dict | None:
        """The newest entry of each partition seen when the last batch was planned."""
        if not self._latest:
            return None
        latest: dict = {}
        for (kind, p), (gen, n, last) in self._latest.items():
            topic = latest.setdefault(kind, {"gen": gen, "parts": {}})
            topic["parts"][p] = {"n": n, "id": last}
        return latest

    def _needs_probe(self, part: dict, last: str | None, ledgers: dict | None) -> bool:
        """Whether a partition read from its start needs a probe for its first ledger first
        (``ProbePartition``): an id says nothing of where earlier ledgers are, and pulsar-lite's
        and Apache Pulsar's ledger ids are the broker's, not the topic's. Without a place to
        record what the probe finds, or after a few probes that found nothing, it goes without."""
        return (bool(self.stats_dir) and last is not None and part["id"] == off.EARLIEST
                and -1 not in {int(k) for k in (ledgers or {}).get("next", {})} and part.get("probe", 0) < MAX_PROBES)

    def _take_clock(self, start: dict, end: dict) -> bool:
        """Copy the clock file's facts into ``end`` (option ``clockFile``); whether the clock
        moved from ``start``'s, so a batch must run even with no new message."""
        if not self.clock_file:
            return False
        clock = clk.wait_for_clock(self.clock_file, start, CLOCK_WAIT_S)
        if clock is None:
            return False
        if clock.through is not None and clock.through != start:
            self._say_late_clock()
        clk.raise_newest(clk.with_facts(end, clock, self.changelogs), start, self.changelogs)
        moved = clk.clock_ms(clk.facts_of(end, self.changelogs))
        return moved is not None and moved != clk.clock_ms(clk.facts_of(start, self.changelogs))

    def _say_late_clock(self) -> None:
        """Warn, at most once a minute, that planning went on without the clock of the batch
        before (each such plan waited CLOCK_WAIT_S, and its watermark moves a batch later)."""
        self._late_clocks += 1
        now = time.monotonic()
        if now - self._late_clock_said >= 60:
            log.warning("the event-time clock file %s had not taken in the last batch after %.0f s (%d plans so far); "
                        "is the job's event-clock listener running?", self.clock_file, CLOCK_WAIT_S, self._late_clocks)
            self._late_clock_said = now

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
        pieces = []
        sizes = self._sizes or {}
        if not sizes:  # a batch planned before a restart: what the read tasks recorded since
            sizes = planning.read_sizes(self.stats_dir)
        for rng in off.ranges_between(start or {}, end):
            per_entry = (sizes.get((rng.topic, rng.partition)) or planning.cold_size(None)).messages
            split_entries = max(1, int(self.split_rows / max(per_entry, 1.0)))
            pieces.extend(off.split_range(rng, off.entry_id_at(rng), split_entries))
        starts = {(kind, p): part for kind, topic_start in (start or {}).items() for p, part in topic_start["parts"].items()}
        probing = [ProbePartition(kind, self.topics[kind], p) for kind, topic_end in end.items()
                   for p, part in topic_end["parts"].items()
                   if part.get("probe", 0) != starts.get((kind, p), {}).get("probe", 0)]
        facts = clk.facts_of(end, self.changelogs)
        bounds = clk.row_bounds(facts)
        reads = [PulsarPartition(r.topic, self.topics[r.topic], r,
                                 bounds.get(clk.partition_name(r.topic, r.partition), bounds[""])) for r in pieces]
        clock_ms = clk.clock_ms(facts)
        if clock_ms is None or clock_ms == clk.clock_ms(clk.facts_of(start, self.changelogs)):
            return reads + probing
        if reads:  # the clock row rides with the batch's first read: no task of its own
            reads[0].clock_ms = clock_ms
            return reads + probing
        return [ClockPartition(clock_ms)] + probing

    def commit(self, end: dict) -> None:
        """Nothing to acknowledge: readers are non-durable, and retention keeps the changelogs."""

    def stop(self) -> None:
        """Nothing to close: planning keeps no reader open."""

    # ------------------------------------------------------------------ executor side
    def read(self, partition):
        if isinstance(partition, ProbePartition):
            planning.record_ledgers(self.stats_dir, partition.kind, partition.partition,
                                    rd.probe_first_ledger(self.service_url, partition.topic, partition.partition))
            return
        transform = load_transform(self.transform, self.transform_args)
        if isinstance(partition, ClockPartition):
            clock = rows.clock_row(partition.clock_ms)
            yield from transform(iter([clock])) if transform else [clock]
            return
        import pyarrow as pa

        read = [0, 0]  # messages, bytes: what this range's entries held, for the planner's estimates

        def counted(batches):
            for batch in batches:
                read[0] += batch.num_rows
                read[1] += batch.nbytes
                if partition.bound is not None:
                    bound = pa.repeat(pa.scalar(partition.bound, pa.int64()), batch.num_rows)
                    batch = batch.set_column(BOUND_INDEX, BOUND_FIELD, bound)
                yield batch
            if partition.clock_ms is not None:
                yield rows.clock_row(partition.clock_ms)
        rng = partition.rng
        found = rd.LedgerFacts()  # where ledgers end, as this read meets them
        batches = counted(rd.read_range(self.service_url, partition.topic, partition.kind, rng, ledgers=found))
        yield from transform(batches) if transform else batches
        planning.record_read(self.stats_dir, partition.kind, rng.partition, found.entries, *read)
        planning.record_ledgers(self.stats_dir, partition.kind, rng.partition, found)
        # The worker lives on and reads the next task: hand this one's messages back.
        give_back_freed_memory()


class PulsarDataSource(DataSource):
    """The ``pulsar`` streaming source (see the module docstring for schema and options)."""

    @classmethod
    def name(cls) -> str:
        return "pulsar"

    def schema(self) -> str:
        return rows.SPARK_SCHEMA

    def streamReader(self, schema) -> PulsarStreamReader:
        return PulsarStreamReader(self.options, schema)
