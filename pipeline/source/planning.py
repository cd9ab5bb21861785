"""How much of each topic partition a micro-batch admits: caps in messages and bytes, changelogs first.

The driver plans a batch from entry ids alone (offsets.py): it knows how many broker *entries*
each partition holds past the last batch, not how many messages or bytes are in them, since an
unbatched message is one entry and a batching producer puts up to 1,000 in one (pulsar-client's
defaults). So each partition's entries are priced with an :class:`EntrySize` learnt from what its
earlier ranges held when they were read (:func:`record_read` on the executors, :func:`read_sizes`
on the driver), or, before anything was read, with a cold guess that errs small
(:func:`cold_size`).

A batch has a budget of 1: an entry costs ``max(messages / max_messages, bytes / max_bytes)``
of it. :func:`plan_batch` spends it:

1. on the changelog partitions first (fair water-filling among them);
2. on the other partitions (orders) only if every changelog partition got all it had, so every
   order in a batch was published before changelog messages the batch (or an earlier one) holds;
3. when the changelogs fill the budget ``share_after`` batches in a row while orders wait, on
   everyone fairly, so a changelog backlog cannot hold orders back for ever;
4. always at least one entry when anything is there, so one entry over the cap still moves.

# plan_batch({"users/-1": 9000, "orders/-1": 500}, cost, first={"users/-1"}, held_for=0, share_after=10)
#   -> Plan(grants={"users/-1": 4000, "orders/-1": 0}, held_for=1, shared=False)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import store

log = logging.getLogger(__name__)

# The most one entry can hold: Pulsar's default maxMessageSize bounds a producer's whole batch.
MAX_ENTRY_BYTES = 5 << 20
# pulsar-client's default batch (batchingMaxMessages): the most messages a cold entry is guessed at.
COLD_MESSAGES_PER_ENTRY = 1000
RAMP = 4  # a batch admits at most this many times the entries its partition's estimate was read from


@dataclass(frozen=True)
class EntrySize:
    """What one entry of a partition holds on average, from a range read there (or a guess)."""

    messages: float
    bytes: float
    entries: int = field(default=0, compare=False)  # how many entries the sample read (0: a guess)

    def cost(self, max_messages: int | None, max_bytes: int | None) -> float:
        """The share of a batch's budget one entry takes (> 0)."""
        parts = [self.messages / max_messages if max_messages else 0.0, self.bytes / max_bytes if max_bytes else 0.0]
        return max(max(parts), 1e-12)

    def most_entries(self, granted_before: int = 0) -> int | None:
        """The most entries a batch may admit on this estimate: :data:`RAMP` times the entries it
        was learnt from, or times what the partition's last batch was granted when more (None: no
        limit, a guess already errs small). A batching producer's first entry is often a short one
        (42 orders, then entries of about 360: a batch planned on the first read 3,958 orders
        against a cap of 500), so an estimate from few entries grows the batch step by step. A
        sample is one read task's (a range is read by several tasks), so its entries alone would
        hold every batch at 4 × a task's share: 40 of 200 entries a batch, a fifth of the cap.
        Entries of one message each (pulsar-client's default producer) are what they seem: no
        limit then."""
        return RAMP * max(self.entries, granted_before) if self.entries and self.messages > 1 else None


def cold_size(newest_entry_messages: int | None) -> EntrySize:
    """A partition nothing was read from yet: a full default batch, or its newest entry's size
    when the broker's id says more (Apache Pulsar gives a batch index; pulsar-lite does not; a
    newest entry can be a short one, the tail of a flush, so it never prices entries smaller), and
    the largest entry a broker takes. The first batch of a cold partition is small, never large."""
    return EntrySize(float(max(newest_entry_messages or 0, COLD_MESSAGES_PER_ENTRY)), float(MAX_ENTRY_BYTES))


def share_budget(available: dict[str, int], cost: dict[str, float], budget: float) -> dict[str, int]:
    """Entries per partition within ``budget``, shared fairly (water-filling): partitions are
    served by ascending demand, each taking at most an equal part of what is left, so what a
    small partition does not need goes to the others."""
    grants = {key: 0 for key in available}
    hungry = sorted((key for key, count in available.items() if count > 0), key=lambda k: (available[k] * cost[k], k))
    for index, key in enumerate(hungry):
        portion = max(0.0, budget) / (len(hungry) - index)
        take = min(available[key], int(portion / cost[key] + 1e-9))
        grants[key] = take
        budget -= take * cost[key]
    return grants


def within_estimates(available: dict[str, int], sizes: dict[str, EntrySize], first: set[str],
                     granted_before: dict[str, int] | None = None) -> dict[str, int]:
    """The entries each partition may offer a batch: all it has for ``first`` (the changelogs:
    orders are admitted only once they have had every entry), otherwise at most what its
    estimate vouches for (:meth:`EntrySize.most_entries`, given the entries the partition's
    last batch was granted, ``granted_before``)."""
    before = granted_before or {}
    limits = {key: None if key in first else sizes[key].most_entries(before.get(key, 0)) for key in available}
    return {key: count if limits[key] is None else min(count, limits[key]) for key, count in available.items()}


@dataclass(frozen=True)
class Plan:
    """A batch's grants in entries per partition, and the orders' hold state after it."""

    grants: dict[str, int]
    held_for: int  # batches in a row the changelogs filled the cap while others waited (0: they did not)
    shared: bool  # the others got a share anyway (held_for passed share_after)


def plan_batch(available: dict[str, int], cost: dict[str, float], first: set[str], held_for: int,
               share_after: int) -> Plan:
    """Spend one batch's budget: ``first`` partitions (the changelogs) before the others (module
    docstring). ``available``: entries each partition has past the last batch; ``cost``: the
    budget one of its entries takes; ``held_for``: the count carried from the last batch."""
    firsts = {key: count for key, count in available.items() if key in first}
    others = {key: count for key, count in available.items() if key not in first}
    grants = _at_least_one(share_budget(firsts, cost, 1.0), firsts)
    if all(grants[key] >= count for key, count in firsts.items()):
        spent = sum(grants[key] * cost[key] for key in firsts)
        grants.update(share_budget(others, cost, 1.0 - spent))
        return Plan(_at_least_one(grants, others), 0, False)
    held_for = held_for + 1 if any(others.values()) else 0
    shared = held_for > share_after
    grants = _at_least_one(share_budget(available, cost, 1.0), firsts) if shared else {**grants, **{key: 0 for key in others}}
    return Plan(grants, held_for, shared)


def _at_least_one(grants: dict[str, int], pool: dict[str, int]) -> dict[str, int]:
    """``grants``, or one entry of the first partition of ``pool`` with any when nothing was
    granted: one entry over the whole cap still moves (a batch holds it alone)."""
    if not any(grants.values()):
        waiting = [key for key in sorted(pool) if pool[key]]
        if waiting:
            grants = {**grants, waiting[0]: 1}
    return grants


# ---------------------------------------------------------------------------- what ranges held
def _sample_path(stats_dir: Path, kind: str, partition: str) -> Path:
    return Path(stats_dir) / f"{kind}.{int(partition)}.json"


def record_read(stats_dir: str | None, kind: str, partition: str, entries: int, messages: int, nbytes: int) -> None:
    """Executor side: what a range just read held (the newest sample of its partition wins).

    ``nbytes``: the Arrow rows the source gave (payload, key, properties and ids).
    """
    if not stats_dir or entries <= 0 or messages <= 0:
        return
    _record(_sample_path(Path(stats_dir), kind, partition), {"entries": entries, "messages": messages, "bytes": nbytes})


def _record(target: Path, facts: dict) -> None:
    """Write ``facts`` to ``target`` whole (a reader never sees half of it); a failure only costs
    the planner what it would have learnt, so it is logged, never raised."""
    try:
        store.replace_file(target, json.dumps(facts))
    except OSError as exc:
        log.warning("cannot record what the source read in %s: %s", target, exc)


def read_sizes(stats_dir: str | None) -> dict[tuple[str, str], EntrySize]:
    """Driver side: the newest sample of every partition read so far ((kind, partition) -> size)."""
    sizes: dict[tuple[str, str], EntrySize] = {}
    if not stats_dir or not Path(stats_dir).is_dir():
        return sizes
    for path in Path(stats_dir).glob("*.json"):
        if path.name.endswith(".ledgers.json"):
            continue
        kind, _, partition = path.stem.rpartition(".")
        try:
            sample = json.loads(path.read_text())
            entries = int(sample["entries"])
            sizes[(kind, str(int(partition)))] = EntrySize(int(sample["messages"]) / entries, int(sample["bytes"]) / entries,
                                                           entries)
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            continue  # a sample being replaced, or damaged: the cold guess stands in
    return sizes


def _ledgers_path(stats_dir: Path, kind: str, partition: str) -> Path:
    return Path(stats_dir) / f"{kind}.{int(partition)}.ledgers.json"


KEPT_LEDGERS = 256  # a partition's newest ledgers whose ends are kept (older ones are learnt again if replayed)


def record_ledgers(stats_dir: str | None, kind: str, partition: str, found) -> None:
    """Executor side: add where a read found ledgers to end (``reader.LedgerFacts``) to what the
    partition's earlier reads found. Two reads racing lose one's facts, which a later read finds
    again."""
    if not stats_dir or not found.next:
        return
    target = _ledgers_path(Path(stats_dir), kind, partition)
    try:
        known = json.loads(target.read_text()) if target.is_file() else {}
    except (OSError, ValueError):
        known = {}
    ends = {int(k): int(v) for k, v in (known.get("ends") or {}).items()}
    following = {int(k): int(v) for k, v in (known.get("next") or {}).items()}
    for ledger, entry in found.ends.items():
        ends[ledger] = min(entry, ends.get(ledger, entry))
    following.update(found.next)
    kept = sorted(following)[-KEPT_LEDGERS:]
    _record(target, {"ends": {str(k): ends[k] for k in kept if k in ends}, "next": {str(k): following[k] for k in kept}})


def read_ledgers(stats_dir: str | None) -> dict[tuple[str, str], dict]:
    """Driver side: what reads found of each partition's ledgers ((kind, partition) -> facts)."""
    found: dict[tuple[str, str], dict] = {}
    if not stats_dir or not Path(stats_dir).is_dir():
        return found
    for path in Path(stats_dir).glob("*.ledgers.json"):
        kind, _, partition = path.name[:-len(".ledgers.json")].rpartition(".")
        try:
            found[(kind, str(int(partition)))] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found
