"""The event-time specification (``enrichment.time = event``): what VersionedLookup decides.

The twin of the processing-time rules in pipeline/enrich/rules.py, which it builds on: the
watermark, lateness, the future horizon, the version current at an order's time, history
pruning, and a pure model of the operator (held to the job by tests/test_event_time_rules.py,
test_event_time_model.py and test_hostile_times.py).
"""

from __future__ import annotations

from typing import Iterable

from pipeline.enrich.lookups import DELETE, LOOKUP, LOOKUPS, READ_ORDER, SET, Lookup
from pipeline.enrich.rules import FOUND, FUTURE, LATE, MISSING, EnrichmentModel, missing_reason, split_by_key

# The envelope's ``late`` column on an order: how its time stood when first judged.
ON_TIME_FLAG, LATE_FLAG, FUTURE_FLAG = 0, 1, 2


class EventEnrichmentModel(EnrichmentModel):
    """The event-time lookups chained as the job chains them (``process`` takes the watermark)."""

    def __init__(self, max_wait_ms: int, allowed_lateness_ms: int, future_after_ms: int | None = None):
        self.lookups = [VersionedLookupModel(lookup, max_wait_ms, allowed_lateness_ms, future_after_ms)
                        for lookup in LOOKUPS]


# ---------------------------------------------------------------- event time (enrichment.time = event)
# The decisions of VersionedLookup (pipeline/jvm/), the event-time twin of ChangelogLookup.
# A version is (time_ms, read_order, record): record None is a tombstone; read_order breaks ties
# between versions of one time (the later read wins). The watermark is Spark's: per changelog topic
# the newest event time read minus the out-of-orderness, the least of the two (users, items).
Version = tuple  # (time_ms, read_order tuple, record tuple | None)


def combined_watermark(newest_ms: dict[str, int | None], out_of_orderness_ms: int) -> int:
    """The changelogs' watermark: per changelog partition (``source.clock.partition_name``: ``users``,
    ``users/0``) its newest event time minus the bound, the least of them.

    A partition that has had no message yet holds it at 0 (Spark's first watermark), so orders
    wait for every partition of every changelog. It never goes below 0."""
    return max(0, min((newest - out_of_orderness_ms) if newest is not None else 0 for newest in newest_ms.values()))


def is_late(order_ms: int, watermark_ms: int, allowed_lateness_ms: int) -> bool:
    """An order is late when the watermark had already passed its time by more than the allowed
    lateness when it was first seen: the versions it needs may have been dropped. A changelog
    version is late by the same test; it is still stored (it is current for orders still to
    come) and counted."""
    return order_ms < watermark_ms - allowed_lateness_ms


def future_after(out_of_orderness_ms: int, future_horizon_ms: int) -> int:
    """How far past the watermark an order's time may be before it is from the future: the
    watermark + the out-of-orderness is the least of the changelog partitions' newest times
    (the time every changelog has reached), and ``enrichment.future_horizon`` is allowed past it."""
    return out_of_orderness_ms + future_horizon_ms


def is_future(order_ms: int, watermark_ms: int, future_after_ms: int | None) -> bool:
    """An order is from the future when its time is more than :func:`future_after` past the
    watermark: the changelogs would have to move on that far before it could be decided (an
    order of the year 9999 would wait forever). It is judged only once the watermark is above 0
    (every changelog partition has a time; before, orders wait for the changelogs), so an order
    first seen at 0 is judged at the first watermark above it. The watermark only grows, so an
    order once judged not future never becomes so. ``future_after_ms`` None: no bound."""
    return future_after_ms is not None and watermark_ms > 0 and order_ms > watermark_ms + future_after_ms


def order_flag(order_ms: int, watermark_ms: int, allowed_lateness_ms: int, future_after_ms: int | None) -> int:
    """How an order's time stands at ``watermark_ms``: :data:`LATE_FLAG`, :data:`FUTURE_FLAG`
    or :data:`ON_TIME_FLAG` (the envelope's ``late`` column)."""
    if is_late(order_ms, watermark_ms, allowed_lateness_ms):
        return LATE_FLAG
    return FUTURE_FLAG if is_future(order_ms, watermark_ms, future_after_ms) else ON_TIME_FLAG


def holds(versions: Iterable[Version], version: Version) -> bool:
    """Whether ``versions`` has one of the same time and the same record (or tombstone), whatever
    its read order: a replay re-reads versions already held (with new read positions), and they
    are not added again. So one key's versions of one time and one record count once, as first
    read (A, tombstone, A at one time is A, tombstone)."""
    return any(held[0] == version[0] and held[2] == version[2] for held in versions)


def distinct_versions(versions: Iterable[Version]) -> list[Version]:
    """``versions`` without those :func:`holds` says are held already (in read order)."""
    kept: list[Version] = []
    for version in sorted(versions, key=lambda v: v[1]):
        if not holds(kept, version):
            kept.append(version)
    return kept


def version_at(versions: Iterable[Version], order_ms: int, max_wait_ms: int) -> tuple[tuple | None, int | None, int]:
    """(record, as_of_ms, waited_ms) for an order at ``order_ms``.

    The version current at the order's time (the newest with time <= order_ms, ties by read
    order); if that is none or a tombstone, the first record within ``max_wait_ms`` after it
    (the order "waited" for it in event time: waited = its time - order_ms); else missing, with
    waited = max_wait_ms. Versions of one time and one record count once, as first read
    (:func:`holds`)."""
    ordered = sorted(distinct_versions(versions), key=lambda v: (v[0], v[1]))
    current = [v for v in ordered if v[0] <= order_ms]
    if current and current[-1][2] is not None:
        return current[-1][2], current[-1][0], 0
    for time_ms, _, record in ordered:
        if order_ms < time_ms <= order_ms + max_wait_ms and record is not None:
            return record, time_ms, time_ms - order_ms
    return None, None, max_wait_ms


def decision_due(order_ms: int, watermark_ms: int, found_at_order_time: bool, max_wait_ms: int) -> bool:
    """Whether an order can be decided under ``watermark_ms``: every version up to its time is in
    (watermark past it), and when none is current there, every version up to its time + max_wait."""
    if watermark_ms <= order_ms:
        return False
    return found_at_order_time or watermark_ms > order_ms + max_wait_ms


def prune_horizon(watermark_ms: int, allowed_lateness_ms: int, max_wait_ms: int) -> int:
    """Versions older than this may go (but the newest of them, still current there): no order
    still to decide is older. A non-late order is at least watermark - lateness when first seen,
    and waits in a lookup only while the watermark is at most its time + max_wait."""
    return watermark_ms - allowed_lateness_ms - max_wait_ms


def prune_versions(versions: list[Version], horizon_ms: int) -> list[Version]:
    """Drop versions older than the horizon, keeping the newest of them unless it is a tombstone
    (a tombstone current at the horizon is the same as no version)."""
    ordered = sorted(versions, key=lambda v: (v[0], v[1]))
    older = [v for v in ordered if v[0] < horizon_ms]
    kept = [v for v in ordered if v[0] >= horizon_ms]
    if older and older[-1][2] is not None:
        kept.insert(0, older[-1])
    return kept


class VersionedLookupModel:
    """One lookup in event time over plain dicts: the specification of VersionedLookup.

    ``process`` is one micro-batch at watermark ``watermark_ms`` (Spark's, from the batches
    before): each key's input rows (versions first, then orders), then the waiting orders that
    are due. An order's decision depends only on the versions up to its time (+ max_wait), never
    on batch sizes or read interleavings, as long as versions keep within the out-of-orderness
    and the order is neither late nor from the future (:func:`is_future`, with
    ``future_after_ms``) when first judged. With ``join_late`` a late order is decided at once
    with the versions held (pruning has kept the one current at the horizon), as Flink's
    temporal join does.
    """

    def __init__(self, lookup: Lookup, max_wait_ms: int, allowed_lateness_ms: int, future_after_ms: int | None = None,
                 join_late: bool = False):
        self.lookup, self.max_wait_ms, self.allowed_lateness_ms = lookup, max_wait_ms, allowed_lateness_ms
        self.future_after_ms = future_after_ms
        self.join_late = join_late  # a late order decided with the versions held (the SQL temporal join)
        self.versions: dict[int, list[Version]] = {}
        self.waiting: dict[int, list[dict]] = {}
        self.late_versions = 0  # versions older than the watermark - allowed lateness when read

    def process(self, rows: Iterable[dict], watermark_ms: int) -> list[dict]:
        out, by_key = split_by_key(rows, self.lookup)
        for key, key_rows in by_key.items():
            for row in key_rows:
                if row["lookup_role"] in (SET, DELETE):
                    record = tuple(row[c] for c in self.lookup.state_columns) if row["lookup_role"] == SET else None
                    version = (row["event_ms"], tuple(row[c] for c in READ_ORDER), record)
                    if not holds(self.versions.get(key, []), version):
                        self.versions.setdefault(key, []).append(version)
                        self.late_versions += is_late(version[0], watermark_ms, self.allowed_lateness_ms)
            for row in (r for r in key_rows if r["lookup_role"] == LOOKUP):
                if row["late"] is None:
                    row = {**row, "late": order_flag(row["event_ms"], watermark_ms, self.allowed_lateness_ms,
                                                     self.future_after_ms)}
                if row["late"] == LATE_FLAG and self.join_late:
                    out.append(self._decide(row, *version_at(self.versions.get(key, []), row["event_ms"],
                                                             self.max_wait_ms)))
                elif row["late"] == LATE_FLAG:
                    out.append(self._decide(row, None, None, 0, LATE))
                elif row["late"] == FUTURE_FLAG:
                    out.append(self._decide(row, None, None, 0, FUTURE))
                elif self._due(key, row, watermark_ms):
                    out.append(self._decide(row, *version_at(self.versions.get(key, []), row["event_ms"],
                                                             self.max_wait_ms)))
                else:
                    self.waiting.setdefault(key, []).append(row)
        out += self.expire(watermark_ms)
        self.prune(watermark_ms)
        return out

    def expire(self, watermark_ms: int) -> list[dict]:
        """The waiting orders the watermark has made due, decided, and those it shows to be from
        the future (only orders first judged at watermark 0 can be), decided ``future`` (the
        operator's timers)."""
        out = []
        for key in list(self.waiting):
            future = [row for row in self.waiting[key]
                      if is_future(row["event_ms"], watermark_ms, self.future_after_ms)]
            out += [self._decide({**row, "late": FUTURE_FLAG}, None, None, 0, FUTURE) for row in future]
            due = [row for row in self.waiting[key] if row not in future and self._due(key, row, watermark_ms)]
            out += [self._decide(row, *version_at(self.versions.get(key, []), row["event_ms"], self.max_wait_ms))
                    for row in due]
            due += future
            self.waiting[key] = [row for row in self.waiting[key] if row not in due]
            if not self.waiting[key]:
                del self.waiting[key]
        return out

    def prune(self, watermark_ms: int) -> None:
        horizon = prune_horizon(watermark_ms, self.allowed_lateness_ms, self.max_wait_ms)
        for key in list(self.versions):
            self.versions[key] = prune_versions(self.versions[key], horizon)
            if not self.versions[key]:
                del self.versions[key]

    def _due(self, key: int, row: dict, watermark_ms: int) -> bool:
        record, _, _ = version_at(self.versions.get(key, []), row["event_ms"], 0)
        return decision_due(row["event_ms"], watermark_ms, record is not None, self.max_wait_ms)

    def _decide(self, row: dict, record: tuple | None, as_of: int | None, waited: int, found: str | None = None) -> dict:
        values = record if record is not None else (None,) * len(self.lookup.state_columns)
        return {**row, **dict(zip(self.lookup.state_columns, values)), self.lookup.as_of_column: as_of,
                self.lookup.found_column: found or (FOUND if record is not None else MISSING),
                "waited_ms": max(waited, row["waited_ms"] or 0)}


def temporal_join(versions: dict[str, dict[int, list[Version]]], orders: Iterable[dict], max_wait_ms: int) -> list[dict]:
    """The event-time enrichment of ``orders`` against the whole history, with no batches at all:
    what the job must write for every order that was not late. ``versions`` maps each changelog
    (users, items) to its versions per key; each order dict has its ids and ``event_ms``.

    # [{"invoice_id": 7, "user_as_of": 1700000000100, "item_as_of": None, "reason": "item", …}]"""
    decided = []
    for order_row in orders:
        row, found = dict(order_row), []
        waited = 0
        for lookup in LOOKUPS:
            record, as_of, lookup_waited = version_at(
                versions.get(lookup.changelog, {}).get(order_row[lookup.id_column], []), order_row["event_ms"], max_wait_ms)
            row.update(zip(lookup.state_columns, record or (None,) * len(lookup.state_columns)))
            row[lookup.as_of_column] = as_of
            found.append(record is not None)
            waited = max(waited, lookup_waited)
        reason = missing_reason(*found)
        decided.append({**row, "waited_ms": waited, "reason": reason, "sink": "missing_state" if reason else "enriched"})
    return decided
