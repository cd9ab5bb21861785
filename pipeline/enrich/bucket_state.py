"""The state of one key bucket of one lookup: RocksDB is the truth, a worker cache is the speed.

Three state variables per bucket (the grouping key of ``transformWithStateInPandas``):

- ``latest`` (ListState of ``id, record``): an append-only log of changes, one appendList call
  per batch however many ids changed (a state call per id was what made loading a million users
  slow). A record is the pickled tuple of the lookup's state columns; ``b""`` is a tombstone.
  When the log grows past twice the live ids it is rewritten compacted.
- ``waiting`` (MapState ``id -> orders``): orders buffered until their id's state arrives.
- ``meta`` (ValueState ``token, log_size``): a random token that changes on every write.

A Python worker keeps each bucket's map (and the ids that have orders waiting) in memory under
the token it last wrote. If the stored token is the same, the cache is exactly the stored state
(any other history, such as a failed attempt of the batch, wrote another token); otherwise the
log and the waiting keys are read back in bulk.

Lifecycle per Spark callback: ``open(bucket)``, then reads and changes, then ``close()``.
"""

from __future__ import annotations

import pickle
import uuid

from pipeline.enrich import rules

_CACHE: dict[tuple[str, int], tuple[str, dict[int, tuple], set[int]]] = {}
COMPACT_FLOOR = 1_000  # never compact logs shorter than this
_TOMBSTONE = b""


class BucketState:
    """id -> latest state values, and the buffered orders, of one bucket of one lookup."""

    def __init__(self, lookup: str, log_state, waiting_state, meta_state):
        self.lookup = lookup
        self.log_state, self.waiting_state, self.meta_state = log_state, waiting_state, meta_state
        self.bucket: int | None = None
        self.records: dict[int, tuple] = {}
        self.waiting_ids: set[int] = set()
        self.token: str | None = None
        self.log_size = 0
        self.pending: list[tuple[int, bytes]] = []
        self.changed = False

    def open(self, bucket: int) -> None:
        meta = self.meta_state.get()
        self.token, self.log_size = (meta[0], meta[1]) if meta else (None, 0)
        self.bucket, self.pending, self.changed = bucket, [], False
        # Take the entry out while we work: if this task dies half-way, nobody sees a half-updated map.
        cached = _CACHE.pop((self.lookup, bucket), None)
        if self.token is None:
            self.records, self.waiting_ids = {}, set()
        elif cached is not None and cached[0] == self.token:
            self.records, self.waiting_ids = cached[1], cached[2]
        else:
            self.records = {}
            for ident, blob in self.log_state.get():
                if blob == _TOMBSTONE:
                    self.records.pop(ident, None)
                else:
                    self.records[ident] = pickle.loads(blob)
            self.waiting_ids = {key[0] for key in self.waiting_state.keys()}

    # -- latest records
    def lookup_many(self, ids: list[int]) -> list[tuple | None]:
        get = self.records.get
        return [get(ident) for ident in ids]

    def apply(self, changes: dict[int, tuple | None]) -> None:
        """Apply the last change per id of this batch (None deletes)."""
        for ident, values in changes.items():
            if values is None:
                self.records.pop(ident, None)
                self.pending.append((ident, _TOMBSTONE))
            else:
                self.records[ident] = values
                self.pending.append((ident, pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)))

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
        if self.pending:
            if self.log_size + len(self.pending) > max(2 * len(self.records), COMPACT_FLOOR):
                self.log_state.put([(ident, pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL))
                                    for ident, values in self.records.items()])
                self.log_size = len(self.records)
            else:
                self.log_state.appendList(self.pending)
                self.log_size += len(self.pending)
        if self.pending or self.changed or self.token is None:
            self.token = uuid.uuid4().hex
            self.meta_state.update((self.token, self.log_size))
        _CACHE[(self.lookup, self.bucket)] = (self.token, self.records, self.waiting_ids)
