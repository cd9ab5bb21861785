"""Idle tables in a temporal join: Flink's ``table.exec.source.idle-timeout``.

A temporal join's watermark is the least of its two tables' (pipeline/sql/temporal_stream.py:
a watermark node per table, and Spark keeps the least). Spark keeps a node where its newest row
put it, so a table that stops sending (a rates table that changes once a day, an orders stream
that has gone quiet) holds the join back for good. With an idle timeout, a table whose read
position has not moved for that long, with nothing unread, is **idle** and no longer holds the
join's watermark back, as Flink's idle sources: its watermark is raised to the least watermark
of the tables still active. When every table is idle the watermark stays where it is, as in
Flink: nothing new can have moved it. A table that sends again holds it again (its rows below
the watermark meanwhile are late, as in Flink).

How it is carried: the driver's :class:`IdleClock` (fed by the pipeline's listener) follows each
table's newest event time (an observed metric per table) and read positions, and writes one
clock file per table (pipeline/source/clock.py's format): nothing while the table is active;
once it is idle, each of its partitions idle at its **heartbeat** time (:func:`heartbeats`). The
table's source carries those facts in its offsets (so a re-read batch is the same) and yields
one clock row at that time when it moved; the row goes through the table's watermark node and
is dropped before the join. Idleness is processing time by nature: where it lets the watermark
pass, results can depend on timing, in Flink as here.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.enrich.event_clock import idle_topics, partition_positions
from pipeline.metrics import source_offset
from pipeline.source.clock import write_clock_file

NEWEST_OBSERVED = "sql_newest_side_{side}"  # a table's newest event time in a batch (observed metric)


def clock_path(root: Path, side: int) -> Path:
    """The clock file of a temporal join's table ``side`` (0 driving, 1 versioned) under the pipeline's folder."""
    return Path(root) / "event-time" / f"clock-{side}.json"


def heartbeats(newest: dict[int, int | None], delays: dict[int, int], idle: set[int]) -> dict[int, int]:
    """Per idle table with a time, the time its heartbeat row carries: its watermark (the row's
    time minus its delay) is then the least watermark of the active tables. None for a table
    already there, and none at all when every table is idle or an active one has no time yet.

    # newest {0: 10_000, 1: 4_000}, delays {0: 1_000, 1: 0}, idle {1} -> {1: 9_000}
    """
    active = [side for side in newest if side not in idle]
    if not active or any(newest[side] is None for side in active):
        return {}
    least = min(newest[side] - delays[side] for side in active)
    return {side: least + delays[side] for side in idle
            if newest.get(side) is not None and least + delays[side] > newest[side]}


class IdleClock:
    """The driver's view of a temporal join's tables for the idle timeout (module docstring):
    ``tables``: each side's table name; ``delays``: each side's WATERMARK delay in ms."""

    def __init__(self, root: Path, tables: list[str], delays: list[int], idle_timeout_ms: int, record=None):
        """``record``: (kind, message, **details) -> None, the pipeline's event recorder: a table
        going idle and sending again are ``table_idle`` and ``table_active`` events."""
        self.record = record
        self.paths = {side: clock_path(root, side) for side in range(len(tables))}
        self.tables, self.delays, self.timeout_ms = list(tables), dict(enumerate(delays)), idle_timeout_ms
        self.newest: dict[int, int | None] = {side: None for side in self.paths}
        self.partitions: dict[int, list[str]] = {side: [] for side in self.paths}  # clock names
        self.positions: dict[str, tuple] = {}
        self.last_moved_ms: dict[str, int] = {}
        self.backlog: dict[str, int | None] = {}
        self.beats: dict[int, int] = {}  # the heartbeat last written per idle side (never lowered)
        self.idle: set[int] = set()
        for side in self.paths:  # a (re)started pipeline starts with every table active
            write_clock_file(self.paths[side], {}, set(), None)

    def observe(self, progress: dict, now_ms: int) -> None:
        """Take one batch's progress: each table's newest time and read positions."""
        observed = progress.get("observedMetrics") or {}
        for side in self.paths:
            value = (observed.get(NEWEST_OBSERVED.format(side=side)) or {}).get("newest_ms")
            if value is not None:
                self.newest[side] = max(int(value), self.newest[side] if self.newest[side] is not None else int(value))
        for source in progress.get("sources") or []:
            end, latest = source_offset(source.get("endOffset")), source_offset(source.get("latestOffset"))
            for name, (generation, position, unread) in partition_positions(end, latest).items():
                if self.positions.get(name) != (generation, position):
                    self.positions[name] = (generation, position)
                    self.last_moved_ms[name] = now_ms
                self.backlog[name] = unread
            for side, table in enumerate(self.tables):
                if table in end:
                    self.partitions[side] = [name for name in partition_positions({table: end[table]}, {})]
        self.update(now_ms)

    def idle_sides(self, now_ms: int) -> set[int]:
        """The tables every partition of which has been idle for the timeout."""
        idle = idle_topics(self.last_moved_ms, self.backlog, now_ms, self.timeout_ms)
        return {side for side, names in self.partitions.items() if names and set(names) <= idle}

    def update(self, now_ms: int) -> dict[int, int]:
        """Write each table's clock file from its idleness at ``now_ms``; returns the heartbeats."""
        idle = self.idle_sides(now_ms)
        for side in sorted(idle ^ self.idle) if self.record is not None else ():
            table = self.tables[side]
            if side in idle:
                self.record("table_idle", f"table {table!r} has sent nothing for {self.timeout_ms / 1000:g}s: it no "
                            "longer holds the temporal join's watermark back while the other table sends", table=table)
            else:
                self.record("table_active", f"table {table!r} sends again: it holds the temporal join's watermark "
                            "again", table=table)
        self.idle = idle
        beats = heartbeats(self.newest, self.delays, idle)
        beats = {side: max(ms, self.beats.get(side, ms)) for side, ms in beats.items()}
        for side in self.paths:
            if beats.get(side) != self.beats.get(side):
                names = self.partitions[side]
                write_clock_file(self.paths[side], {name: beats[side] for name in names} if side in beats else {},
                                 set(names) if side in beats else set(), None)
        self.beats = beats
        return beats
