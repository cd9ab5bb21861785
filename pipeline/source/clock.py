"""The event-time clock a batch carries: how far each changelog partition has got, in its offset.

Event time needs one watermark for the job: the least of the changelog partitions' newest event
times (minus the out-of-orderness), idle partitions left out. Spark computes a watermark per
watermark node from the rows it sees, so the job used to read the source once per changelog
partition to give each its own node. Here the source is read once, and the driver's clock
travels with the batches instead:

- after each batch the driver (``pipeline/enrich/event_clock.py``) writes a **clock file**:
  each changelog partition's newest event time, which ones are idle, and the end offset of the
  batch it has taken in (``through``);
- planning the next batch, the source waits briefly for the file to have taken in the batch
  before it (``wait_for_clock``), and copies the facts into the end offset (``with_facts``,
  never below the offset it plans after: ``raise_newest``), so a batch re-read after a crash
  carries the same facts: the watermark does not depend on when it is re-read;
- every row gets a **bound** (``row_bounds``): the most its time may count for the watermark. A
  row of an active changelog partition counts up to the least newest time of the *other* active
  partitions, so the most any row stamps is never above the least newest time of all of them,
  the clock itself; rows of idle partitions and other topics do not count (all of them do,
  unbounded, once every changelog partition is idle). In a batch where one partition moves and
  the others do not, the watermark gets exactly where a node per partition would have put it;
- when the clock (``clock_ms``) has moved with no new message, the source still advances its
  offset and yields one **clock row** at that time, so a quiet stream gets a batch that moves
  the watermark (``event_clock`` marks partitions idle, which moves the clock).

Partitions are named by :func:`partition_name`: ``users`` for a topic that is not
partitioned (partition -1), ``users/0`` for a partition. Everything here is pure but the file.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline import store
from pipeline.wire import MAX_TIME_MS

UNBOUNDED = MAX_TIME_MS  # a row's own time counts, whatever it is (the wire keeps times below it)
NEWEST, IDLE = "newest_ms", "idle"  # a changelog partition's facts, in its offset


@dataclass(frozen=True)
class ClockFile:
    """What the driver last wrote: newest time per partition name, idle names, and the end offset
    of the last batch it took in (None: none since the job started)."""

    newest: dict[str, int | None]  # every partition the driver follows; None: nothing read yet
    idle: frozenset[str]
    through: dict | None


def partition_name(kind: str, partition: str | int) -> str:
    """A changelog partition's clock name: ``users``, -1 (not partitioned) -> ``users``; ``users``, 0 -> ``users/0``."""
    return kind if int(partition) < 0 else f"{kind}/{int(partition)}"


def write_clock_file(path: Path, newest: dict[str, int | None], idle: set[str], through: dict | None) -> None:
    """Replace the clock file at once (a reader never sees half of one)."""
    store.replace_file(path, json.dumps({"newest": newest, "idle": sorted(idle), "through": through}))


def read_clock_file(path: str | Path | None) -> ClockFile | None:
    """The clock file, or None when there is none (or it cannot be read: the next trigger looks again)."""
    if not path:
        return None
    try:
        raw = json.loads(Path(path).read_text())
        return ClockFile({str(k): None if v is None else int(v) for k, v in (raw.get("newest") or {}).items()},
                         frozenset(str(name) for name in raw.get("idle") or ()), raw.get("through"))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def wait_for_clock(path: str | Path, start: dict, timeout_s: float) -> ClockFile | None:
    """The clock file once it has taken in the batch that ended at ``start``, or as it is after
    ``timeout_s`` (the driver takes a batch in from Spark's listener bus, a moment after Spark
    may already plan the next one; a late clock only delays the watermark by a batch)."""
    deadline = time.monotonic() + timeout_s
    while True:
        clock = read_clock_file(path)
        if clock is None or clock.through is None or clock.through == start or time.monotonic() >= deadline:
            return clock
        time.sleep(0.005)


def with_facts(offset: dict, clock: ClockFile, changelogs: set[str]) -> dict:
    """``offset`` with each changelog partition's newest time and idleness from ``clock`` (in place)."""
    for kind in changelogs:
        for p, part in (offset.get(kind) or {}).get("parts", {}).items():
            name = partition_name(kind, p)
            part.pop(NEWEST, None)
            part.pop(IDLE, None)
            if name in clock.newest:  # a partition the driver follows (None: nothing read yet)
                part[NEWEST] = clock.newest[name]
                if name in clock.idle:
                    part[IDLE] = True
    return offset


def raise_newest(end: dict, start: dict, changelogs: set[str]) -> dict:
    """``end`` with each followed changelog partition's newest time never below ``start``'s (in
    place): a clock file that had not taken in the batch before (``wait_for_clock`` gave up)
    holds older times than the offset it plans after, and the facts must not go back with it.

    # start users/0 newest 5000, end (from a late clock) 4000 -> 5000
    """
    before = facts_of(start, changelogs)
    for kind in changelogs:
        for p, part in (end.get(kind) or {}).get("parts", {}).items():
            if NEWEST not in part:
                continue  # a partition the driver does not follow
            known = [t for t in (part[NEWEST], before.get(partition_name(kind, p), (None, False))[0]) if t is not None]
            part[NEWEST] = max(known) if known else None
    return end


def facts_of(offset: dict | None, changelogs: set[str]) -> dict[str, tuple[int | None, bool]]:
    """Per changelog partition name: (newest time or None, idle), as ``offset`` carries them;
    {} for an offset that carries none (planned without a clock)."""
    facts = {}
    for kind in changelogs:
        for p, part in ((offset or {}).get(kind) or {}).get("parts", {}).items():
            if NEWEST in part:
                facts[partition_name(kind, p)] = (part[NEWEST], bool(part.get(IDLE)))
    return facts


def clock_ms(facts: dict[str, tuple[int | None, bool]]) -> int | None:
    """The job's clock: the least newest time of the active changelog partitions, or when every
    one is idle the newest of all; None while an active one has no time yet (it holds the
    watermark at 0) or there are no facts.

    # {"users/0": (5000, False), "users/1": (3000, False), "items": (9000, True)} -> 3000
    """
    active = [newest for newest, idle in facts.values() if not idle]
    if active:
        return None if None in active else min(active)
    times = [newest for newest, _ in facts.values() if newest is not None]
    return max(times) if times else None


def row_bounds(facts: dict[str, tuple[int | None, bool]]) -> dict[str, int | None]:
    """Per changelog partition name, the most a row of it may count for the watermark (None: it
    does not count), and under ``""`` the bound of every other row (other topics, partitions
    the facts do not name). No row's bound is above :func:`clock_ms` of the same facts, except
    that an active partition's own rows count up to their own time where it is the least.

    # {"users": (5000, False), "items": (9000, False)} -> {"users": 9000, "items": 5000, "": None}
    """
    active = {name: newest for name, (newest, idle) in facts.items() if not idle}
    if not facts:
        return {"": None}
    if not active:  # every changelog partition idle: every row's own time counts
        return {"": UNBOUNDED, **{name: UNBOUNDED for name in facts}}
    bounds: dict[str, int | None] = {"": None}
    for name in facts:
        if name not in active:
            bounds[name] = None
            continue
        others = [newest for other, newest in active.items() if other != name]
        bounds[name] = None if None in others else min(others, default=UNBOUNDED)
    return bounds
