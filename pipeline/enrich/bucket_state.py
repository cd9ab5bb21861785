"""The latest records of one key bucket: RocksDB MapState is the truth, a worker cache is the speed.

Looking up every order in Spark's state store costs one socket round trip to the JVM, which
made the per-order cost dominate. Instead each bucket keeps, next to its ``latest`` MapState, a
``meta`` ValueState with a random *token* that changes on every write. A Python worker keeps the
bucket's records in memory under the token it last saw; if the token in the state store is the
same, the cache is exactly the stored map (any other history, such as a failed attempt of a
batch, wrote a different token), otherwise the map is re-read in bulk through the iterator.

Writes go through at the end of each ``handleInputRows`` call, one per changed id.
Lifecycle: ``open`` once per bucket per call, then ``get``/``put``/``delete``, then ``close``.
"""

from __future__ import annotations

import pickle
import uuid

_CACHE: dict[tuple[str, int], tuple[str, dict[int, dict]]] = {}
_DELETED = object()


class LatestRecords:
    """id -> latest record (a checked wire record; pickled in the state store) of one bucket of one lookup."""

    def __init__(self, lookup: str, latest_state, meta_state):
        self.lookup = lookup
        self.latest_state, self.meta_state = latest_state, meta_state
        self.bucket: int | None = None
        self.records: dict[int, dict] = {}
        self.pending: dict[int, object] = {}
        self.token: str | None = None
        self.waiting_ids = 0  # ids of this bucket with orders waiting for them
        self.meta_changed = False

    def open(self, bucket: int) -> None:
        meta = self.meta_state.get()
        self.token, self.waiting_ids = (meta[0], meta[1]) if meta else (None, 0)
        self.bucket, self.pending, self.meta_changed = bucket, {}, False
        # Take the entry out while we work: if this task dies half-way, nobody sees a half-updated map.
        cached = _CACHE.pop((self.lookup, bucket), None)
        if self.token is None:
            self.records = {}
        elif cached is not None and cached[0] == self.token:
            self.records = cached[1]
        else:
            self.records = {key[0]: pickle.loads(value[0]) for key, value in self.latest_state.iterator()}

    def get(self, ident: int) -> dict | None:
        return self.records.get(ident)

    def put(self, ident: int, record: dict) -> None:
        self.records[ident] = record
        self.pending[ident] = record

    def delete(self, ident: int) -> None:
        self.records.pop(ident, None)
        self.pending[ident] = _DELETED

    def add_waiting(self, count: int) -> None:
        self.waiting_ids += count
        self.meta_changed = True

    def close(self) -> None:
        """Write the changes through to the state store and keep the map for the next batch."""
        for ident, record in self.pending.items():
            if record is _DELETED:
                self.latest_state.removeKey((ident,))
            else:
                self.latest_state.updateValue((ident,), (pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL),))
        if self.pending or self.meta_changed:
            self.token = uuid.uuid4().hex if self.pending or self.token is None else self.token
            self.meta_state.update((self.token, self.waiting_ids))
        if self.token is not None:
            _CACHE[(self.lookup, self.bucket)] = (self.token, self.records)
