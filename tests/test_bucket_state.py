"""BucketState over in-memory stand-ins for Spark's state handles: the worker cache and its bound."""

from __future__ import annotations

import pytest

from pipeline.enrich import bucket_state
from pipeline.enrich.bucket_state import BucketState


class FakeList:
    def __init__(self):
        self.items = []

    def get(self):
        return iter(list(self.items))

    def put(self, items):
        self.items = list(items)

    def appendList(self, items):
        self.items.extend(items)


class FakeMap:
    def __init__(self):
        self.items = {}

    def keys(self):
        return iter(list(self.items))


class FakeValue:
    def __init__(self):
        self.value = None

    def get(self):
        return self.value

    def update(self, value):
        self.value = value


class Store:
    """One bucket's three state variables, as RocksDB would keep them across calls."""

    def __init__(self):
        self.log, self.waiting, self.meta = FakeList(), FakeMap(), FakeValue()

    def state(self) -> BucketState:
        return BucketState("users", self.log, self.waiting, self.meta)


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch):
    monkeypatch.setattr(bucket_state, "_CACHE", type(bucket_state._CACHE)())


def write(store: Store, bucket: int, changes: dict) -> None:
    state = store.state()
    state.open(bucket)
    state.apply(changes)
    state.close()


def test_latest_records_survive_a_worker_that_never_saw_them():
    store = Store()
    write(store, 1, {10: ("Ada",), 11: ("Bob",)})
    write(store, 1, {11: None, 12: ("Cy",)})
    bucket_state._CACHE.clear()  # another worker: only the stored log is there
    state = store.state()
    state.open(1)
    assert state.lookup_many([10, 11, 12]) == [("Ada",), None, ("Cy",)]


def test_cache_is_bounded_and_an_evicted_bucket_is_rebuilt_from_its_log(monkeypatch):
    monkeypatch.setattr(bucket_state, "MAX_CACHED_RECORDS", 3)
    stores = {bucket: Store() for bucket in (1, 2)}
    write(stores[1], 1, {10: ("a",), 11: ("b",)})
    write(stores[2], 2, {20: ("c",), 21: ("d",)})
    assert list(bucket_state._CACHE) == [("users", 2)]  # bucket 1 was least recently used
    state = stores[1].state()
    state.open(1)
    assert state.lookup_many([10, 11]) == [("a",), ("b",)]
