"""A temporal join's event-time clock: each table's watermark, the least of its partitions', and idle tables.

A temporal join reads each table in a source of its own, so each has its own watermark node
(pipeline/sql/temporal_stream.py), and Spark keeps the least of the nodes. Flink's watermark of
a partitioned table is the least of its partitions': a partition that lags behind the others
holds the table back, and its rows are not late. Spark's node would take the newest row of any
partition. So the driver keeps each table's clock, as the job keeps its changelogs'
(pipeline/source/clock.py, pipeline/enrich/event_clock.py), and the source bounds each row with it:

- after each batch :class:`JoinClock` (fed by the pipeline's listener) takes each partition's
  newest event time (an observed metric per table, a column per partition) and read position,
  and writes one **clock file per table**: its partitions' newest times, the idle ones and the
  batch taken in. The table's source carries those facts in its offsets (a re-read batch is the
  same) and gives every row its ``watermark_bound``: a row counts for its table's watermark up
  to the least newest time of the table's other active partitions. So the table's watermark is
  the least of its partitions' newest times minus its delay. When that least moves with no new
  message, the source yields one clock row at it (op ``clock``, dropped after the watermark
  nodes). A partition that has sent nothing holds its table back, as in Flink.
- ``table.exec.source.idle-timeout`` (Flink's idle sources): a partition whose read position has
  not moved for that long, with nothing unread, is **idle** and no longer holds its table back.
  A table whose every partition is idle no longer holds the join back: its watermark is raised
  to the least watermark of the tables still active (:func:`heartbeats`; its clock file then
  puts each partition idle at that time, so the clock row carries it there). When every table is
  idle, each is raised to the greatest watermark of all, as Flink flushes it when its last input
  goes idle. A partition that sends again holds it again (its rows below the watermark meanwhile are late, as in
  Flink). Idleness is processing time by nature: where it lets the watermark pass, results can
  depend on timing, in Flink as here.
- the newest time per partition as of each committed batch is kept in the checkpoint
  (``event_clock.keep_newest``): Spark restores only the join's watermark after a restart, and a
  quiet partition must not hold it back anew.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.enrich.event_clock import idle_topics, keep_newest, partition_positions, restored_newest
from pipeline.metrics import source_offset
from pipeline.source.clock import NEWEST, clock_ms, partition_name, write_clock_file

NEWEST_OBSERVED = "sql_newest_side_{side}"  # per table: each partition's newest event time in a batch


def clock_path(root: Path, side: int) -> Path:
    """The clock file of a temporal join's table ``side`` (0 driving, then each versioned table)."""
    return Path(root) / "event-time" / f"clock-{side}.json"


def heartbeats(position: dict[int, int | None], delays: dict[int, int], idle: set[int]) -> dict[int, int]:
    """Per idle table, the time its heartbeat carries it to (``position``: each table's clock, its
    watermark plus its delay, None before it has one): its watermark is then the least watermark
    of the active tables. When every table is idle, the greatest watermark of all, as Flink
    flushes it when its last input goes idle (StatusWatermarkValve). None for a table already
    there, and none at all while an active table has no time yet. An idle table that never sent
    is raised too: Spark holds the join at 0 for a watermark node that has seen no row.

    # position {0: 10_000, 1: 4_000}, delays {0: 1_000, 1: 0}, idle {1} -> {1: 9_000}
    """
    active = [side for side in position if side not in idle]
    if any(position[side] is None for side in active):
        return {}
    marks = [position[side] - delays[side] for side in (active or position) if position[side] is not None]
    if not marks:
        return {}
    target = min(marks) if active else max(marks)
    return {side: target + delays[side] for side in idle
            if position.get(side) is None or target + delays[side] > position[side]}


class JoinClock:
    """The driver's clock of a temporal join's tables (module docstring): ``tables``: each side's
    table name; ``delays``: each side's WATERMARK delay in ms; ``idle_timeout_ms``: 0 marks none
    idle; ``partitions``: each table's partitions when the query is built (as
    ``counts.list_topic_partitions`` gives them; each holds its table back until it has a time);
    ``shared_read``: the tables of a statement set's shared read, which may read the same topics."""

    def __init__(self, root: Path, tables: list[str], delays: list[int], idle_timeout_ms: int, record=None,
                 partitions: dict[str, list[str]] | None = None, shared_read: frozenset[str] = frozenset()):
        """``record``: (kind, message, **details) -> None, the pipeline's event recorder: a table
        going idle and sending again are ``table_idle`` and ``table_active`` events, and a partition
        of a partitioned table ``partition_idle`` and ``partition_active``."""
        self.record, self.checkpoint = record, Path(root) / "checkpoint"
        self.paths = {side: clock_path(root, side) for side in range(len(tables))}
        self.tables, self.delays, self.timeout_ms = list(tables), dict(enumerate(delays)), idle_timeout_ms
        self.shared_read = frozenset(shared_read)
        self.newest: dict[str, int] = restored_newest(self.checkpoint)  # per partition (clock name)
        self.partitions: dict[int, list[str]] = {side: [partition_name(table, p) for p in (partitions or {}).get(table, [])]
                                                 for side, table in enumerate(tables)}
        self.through: dict[int, dict | None] = {side: None for side in self.paths}
        self.positions: dict[str, tuple] = {}
        self.last_moved_ms: dict[str, int] = {}
        self.backlog: dict[str, int | None] = {}
        self.history: list[dict] = []
        self.idle: set[int] = set()  # idle tables
        self.idle_partitions: set[str] = set()  # the idle partitions of partitioned tables (clock names)
        self.beats: dict[int, int] = {}  # the heartbeat last written per idle table (never lowered)
        self.written: dict[int, tuple] = {}
        self.update(0)  # a (re)started pipeline starts with every partition active

    def observe(self, progress: dict, now_ms: int) -> None:
        """Take one (committed) batch's progress: each partition's newest time and read position."""
        observed = progress.get("observedMetrics") or {}
        for side in self.paths:
            for name, value in (observed.get(NEWEST_OBSERVED.format(side=side)) or {}).items():
                if value is not None:
                    self.newest[name] = max(int(value), self.newest.get(name, int(value)))
        self.history = keep_newest(self.checkpoint, self.history, progress["batchId"], self.newest)
        for source in progress.get("sources") or []:
            end, latest = source_offset(source.get("endOffset")), source_offset(source.get("latestOffset"))
            side = self.side_of(end)
            if side is None:
                continue  # another INSERT's read of the same topics (a statement set): not this clock's
            for name, (generation, position, unread) in partition_positions(end, latest).items():
                if self.positions.get(name) != (generation, position):
                    self.positions[name] = (generation, position)
                    self.last_moved_ms[name] = now_ms
                self.backlog[name] = unread
            self.partitions[side] = list(partition_positions(end, {}))
            self.through[side] = end
        self.update(now_ms)

    def side_of(self, end: dict) -> int | None:
        """The side whose own source ended at ``end``: one table's offsets, and not the statement
        set's shared read. When that read has this one table too, the side's own offsets are
        those that carry its clock's facts (before it has any, both read the topic from the start)."""
        if len(end) != 1 or next(iter(end)) not in self.tables:
            return None
        table, offsets = next(iter(end.items()))
        if self.shared_read == {table} and not any(NEWEST in part for part in ((offsets or {}).get("parts") or {}).values()):
            return None
        return self.tables.index(table)

    def position(self, side: int, idle_partitions: set[str]) -> int | None:
        """The table's clock: the least newest time of its active partitions (the newest of all
        when every one is idle); None while an active one has none, or before any is known."""
        names = self.partitions[side]
        return clock_ms({name: (self.newest.get(name), name in idle_partitions) for name in names}) if names else None

    def _record_partitions(self, idle_partitions: set[str]) -> None:
        """A partition of a partitioned table going idle or sending again is a ``partition_idle`` /
        ``partition_active`` event naming the table and the partition, as the job's ``topic_idle``
        (a table of one partition has only its table's event)."""
        partitioned = {name: table for side, table in enumerate(self.tables)
                       if len(self.partitions[side]) > 1 for name in self.partitions[side]}
        now_idle = {name for name in idle_partitions if name in partitioned}
        for name in sorted(now_idle ^ self.idle_partitions) if self.record is not None else ():
            table, partition = partitioned[name], int(name.rpartition("/")[2])
            if name in now_idle:
                self.record("partition_idle", f"table {table!r} partition {partition} has sent nothing for "
                            f"{self.timeout_ms / 1000:g}s: it no longer holds its table's watermark back",
                            table=table, partition=partition)
            else:
                self.record("partition_active", f"table {table!r} partition {partition} sends again: it holds "
                            "its table's watermark again", table=table, partition=partition)
        self.idle_partitions = now_idle

    def update(self, now_ms: int) -> dict[int, int]:
        """Write each table's clock file as it stands at ``now_ms`` (only those that changed);
        returns the heartbeats of the idle tables."""
        idle_partitions = idle_topics(self.last_moved_ms, self.backlog, now_ms, self.timeout_ms)
        idle = {side for side, names in self.partitions.items() if names and set(names) <= idle_partitions}
        self._record_partitions(idle_partitions)
        for side in sorted(idle ^ self.idle) if self.record is not None else ():
            table = self.tables[side]
            if side in idle:
                self.record("table_idle", f"table {table!r} has sent nothing for {self.timeout_ms / 1000:g}s: it no "
                            "longer holds the temporal join's watermark back while the other table sends", table=table)
            else:
                self.record("table_active", f"table {table!r} sends again: it holds the temporal join's watermark "
                            "again", table=table)
        self.idle = idle
        beats = heartbeats({side: self.position(side, idle_partitions) for side in self.paths}, self.delays, idle)
        self.beats = {side: max(ms, self.beats.get(side, ms)) for side, ms in beats.items()}
        for side, path in self.paths.items():
            names = self.partitions[side]
            if side in self.beats:  # every partition idle at the heartbeat: the source's clock row carries it there
                newest, idle_names = {name: self.beats[side] for name in names}, set(names)
            else:
                newest, idle_names = {name: self.newest.get(name) for name in names}, set(names) & idle_partitions
            facts = (newest, sorted(idle_names), self.through[side])
            if facts != self.written.get(side):
                write_clock_file(path, newest, idle_names, self.through[side])
                self.written[side] = facts
        return self.beats



def join_clock_for(root: Path, plans, settings, service_url: str, record) -> JoinClock | None:
    """The clock of a pipeline's temporal join (its INSERTs' ``plans``; one at most has one), or
    None: its tables' partitions listed now, and the tables of a statement set's shared read."""
    from pipeline.source.counts import list_topic_partitions
    from pipeline.sql.settings import idle_timeout_ms

    temporal = next((plan for plan in plans if plan.temporal is not None), None)
    if temporal is None:
        return None
    tables = temporal.sides
    partitions = list_topic_partitions(service_url, {t.name: t.topic for t in tables}, settings["pulsar.auth_token"])
    shared = frozenset(t.name for plan in plans if plan.temporal is None for t in plan.sides)
    return JoinClock(root, [t.name for t in tables], [int(t.watermark[1]) for t in tables],
                     idle_timeout_ms(temporal.settings), record, partitions, shared)
