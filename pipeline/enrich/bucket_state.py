"""The state of one key bucket of one lookup: RocksDB is the truth, a worker cache is the speed.

Three state variables per bucket (the grouping key of ``transformWithStateInPandas``):

- ``latest`` (ListState of ``token, changes``): a log with one entry per batch that changed
  the bucket: the pickled ``{id: state values, or None for a tombstone}`` of that batch, and a
  random token naming the entry. One state call per bucket per batch, however many ids
  changed. Past ``MAX_LOG_ENTRIES`` the log is rewritten as one entry holding the whole map.
- ``waiting`` (MapState ``id -> orders``): orders buffered until their id's state arrives.
- ``meta`` (ValueState ``token``): the token of the newest log entry or buffer change.

A Python worker keeps each bucket's map in memory with the tokens of the log entries it was
built from, up to :data:`MAX_CACHED_RECORDS` records in all (least recently used buckets are
dropped first, and rebuilt from the log when next needed). Spark hands tasks to any free
worker, so without that bound every worker would end up holding every bucket. Spark sends a bucket to whichever worker is free, so a worker often finds that
another one wrote since; it then reads the log and applies only the entries after the ones it
has (a failed attempt of a batch wrote entries nobody else has, so a token that differs means
rebuilding from the start).

Lifecycle per Spark callback: ``open(bucket)``, then reads and changes, then ``close()``.
"""

from __future__ import annotations

import pickle
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from pipeline.enrich import rules

MAX_LOG_ENTRIES = 32
# About 150 MB of cached state per Python worker; measured at about 5 KB per user per job
# with no bound (every worker caching every bucket), which put 5M users out of reach of 24 GB.
MAX_CACHED_RECORDS = 600_000


@dataclass
class _Cached:
    token: str  # meta token when this worker last closed the bucket
    log_tokens: list[str]  # tokens of the log entries applied to ``records``, in order
    records: dict[int, tuple]
    waiting_ids: set[int] = field(default_factory=set)


_CACHE: "OrderedDict[tuple[str, int], _Cached]" = OrderedDict()  # least recently used first


def _remember(key: tuple[str, int], cached: _Cached) -> None:
    """Keep a bucket's map for the next call, dropping the least recently used over the bound."""
    _CACHE[key] = cached
    _CACHE.move_to_end(key)
    total = sum(len(entry.records) for entry in _CACHE.values())
    while total > MAX_CACHED_RECORDS and len(_CACHE) > 1:
        _, dropped = _CACHE.popitem(last=False)
        total -= len(dropped.records)


def _dumps(value) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


class BucketState:
    """id -> latest state values, and the buffered orders, of one bucket of one lookup."""

    def __init__(self, lookup: str, log_state, waiting_state, meta_state):
        self.lookup = lookup
        self.log_state, self.waiting_state, self.meta_state = log_state, waiting_state, meta_state
        self.bucket: int | None = None
        self.cached = _Cached("", [], {})
        self.pending: dict[int, tuple | None] = {}
        self.changed = False

    @property
    def records(self) -> dict[int, tuple]:
        return self.cached.records

    @property
    def waiting_ids(self) -> set[int]:
        return self.cached.waiting_ids

    def open(self, bucket: int) -> None:
        meta = self.meta_state.get()
        token = meta[0] if meta else None
        self.bucket, self.pending, self.changed = bucket, {}, False
        # Take the entry out while we work: if this task dies half-way, nobody sees a half-updated map.
        cached = _CACHE.pop((self.lookup, bucket), None)
        if token is None:
            self.cached = _Cached("", [], {})
        elif cached is not None and cached.token == token:
            self.cached = cached
        else:
            self.cached = self._catch_up(cached)

    def _catch_up(self, cached: "_Cached | None") -> "_Cached":
        """Bring a worker's copy up to the stored log (or rebuild it when the histories differ)."""
        known = cached.log_tokens if cached is not None else []
        entries = list(self.log_state.get())
        stored = [token for token, _ in entries]
        if known and stored[:len(known)] == known:
            records, start = cached.records, len(known)
        else:
            records, start = {}, 0
        for _, blob in entries[start:]:
            for ident, values in pickle.loads(blob).items():
                if values is None:
                    records.pop(ident, None)
                else:
                    records[ident] = values
        waiting = {key[0] for key in self.waiting_state.keys()}
        return _Cached("", stored, records, waiting)

    # -- latest records
    def lookup_many(self, ids: list[int]) -> list[tuple | None]:
        get = self.records.get
        return [get(ident) for ident in ids]

    def apply(self, changes: dict[int, tuple | None]) -> None:
        """Apply the last change per id of this batch (None deletes)."""
        for ident, values in changes.items():
            if values is None:
                self.records.pop(ident, None)
            else:
                self.records[ident] = values
        self.pending.update(changes)

    # -- buffered orders
    def hold(self, ident: int, rows: list[dict]) -> None:
        """Buffer orders (envelope rows) until ``ident``'s state arrives or their wait is over."""
        held = rules.WaitingOrders()
        if ident in self.waiting_ids:
            stored = self.waiting_state.getValue((ident,))
            held = rules.WaitingOrders.load(stored[0] if stored else None)
        for row in rows:
            held.add(row)
        self.waiting_state.updateValue((ident,), (held.dump(),))
        self.waiting_ids.add(ident)
        self.changed = True

    def release(self, ids) -> list[dict]:
        """The orders that waited for these ids, taken out of the buffer."""
        released: list[dict] = []
        for ident in ids:
            if ident not in self.waiting_ids:
                continue
            stored = self.waiting_state.getValue((ident,))
            self.waiting_state.removeKey((ident,))
            self.waiting_ids.discard(ident)
            self.changed = True
            released.extend(rules.WaitingOrders.load(stored[0] if stored else None).entries)
        return released

    def expire(self, now_ms: int, max_wait_ms: int) -> list[dict]:
        """The buffered orders whose wait is over, taken out of the buffer."""
        if not self.waiting_ids:
            return []
        expired: list[dict] = []
        for (ident,), (blob,) in list(self.waiting_state.iterator()):
            held = rules.WaitingOrders.load(blob)
            done = held.split_expired(now_ms, max_wait_ms)
            if not done:
                continue
            expired.extend(done)
            self.changed = True
            if held.entries:
                self.waiting_state.updateValue((ident,), (held.dump(),))
            else:
                self.waiting_state.removeKey((ident,))
                self.waiting_ids.discard(ident)
        return expired

    def close(self) -> None:
        """Write the changes through to the state store and keep the map for the next call."""
        cached = self.cached
        if self.pending:
            entry = uuid.uuid4().hex
            if len(cached.log_tokens) + 1 > MAX_LOG_ENTRIES:
                self.log_state.put([(entry, _dumps(cached.records))])
                cached.log_tokens = [entry]
            else:
                self.log_state.appendList([(entry, _dumps(self.pending))])
                cached.log_tokens.append(entry)
        if self.pending or self.changed or not cached.token:
            cached.token = uuid.uuid4().hex
            self.meta_state.update((cached.token,))
        _remember((self.lookup, self.bucket), cached)
