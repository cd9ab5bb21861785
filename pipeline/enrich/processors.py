"""UserLookup and ItemLookup: thin transformWithState glue around pipeline/enrich/rules.py.

Each lookup is grouped by a key *bucket* (``id % job.buckets``), so Spark calls the processor
once per bucket per batch instead of once per key. Inside a bucket two MapStates hold:

- ``latest``: id -> the newest record of that user/item (JSON), in topic-partition read order;
  a tombstone removes the id;
- ``waiting``: id -> the orders buffered for that id until ``max_wait`` (JSON list).

Call order per batch (Spark's): ``handleInputRows`` once per bucket with rows, then
``handleExpiredTimer`` once per expired processing-time timer. Rows a lookup does not act on
(dead letters, the other lookup's changelog) pass straight through.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Iterator

from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from pipeline.enrich import rules
from pipeline.enrich.bucket_state import LatestRecords

EnvelopeRow = Row("user_bucket", "item_bucket", "body")
TIMER_GRANULARITY_MS = 100  # fewer distinct timers; an order may wait up to 100 ms longer


def to_row(env: dict) -> Row:
    return EnvelopeRow(env["user_bucket"], env["item_bucket"], rules.pack(env))


class _Lookup(StatefulProcessor):
    """Shared lookup logic; subclasses say which changelog they hold and how an order completes."""

    changelog = ""  # "users" or "items"
    id_field = ""  # "user_id" or "item_id"

    def __init__(self, max_wait_ms: int):
        self.max_wait_ms = max_wait_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.meta = handle.getValueState("meta", "token string, waiting int")
        self.records = LatestRecords(self.changelog, handle.getMapState("latest", "id long", "record binary"), self.meta)
        self.waiting = handle.getMapState("waiting", "id long", "orders binary")

    # -- what differs between the two lookups
    @abstractmethod
    def complete(self, env: dict, record: dict | None, now_ms: int) -> dict:
        """The envelope of an order whose lookup is done (record is None when missing)."""

    def pass_through(self, env: dict) -> dict:
        return env

    # -- Spark callbacks
    def handleInputRows(self, key, rows: Iterator[Row], timerValues) -> Iterator[Row]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        self.records.open(key[0])
        for env in rules.sorted_rows(rules.unpack(row[2]) for row in rows):
            if rules.passes_through(env, self.changelog):
                yield to_row(self.pass_through(env))
            elif env["op"] == "upsert":
                ident = env[self.id_field]
                self.records.put(ident, env["record"])
                if self.records.waiting_ids:
                    yield from self._release(ident, env["record"], now_ms)
            elif env["op"] == "delete":
                self.records.delete(env[self.id_field])
            else:
                yield from self._lookup(env, now_ms)
        self.records.close()

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[Row]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        emptied = 0
        for (ident,), (text,) in list(self.waiting.iterator()):
            waiting = rules.WaitingOrders.load(text)
            expired = waiting.split_expired(now_ms, self.max_wait_ms)
            if not expired:
                continue
            if waiting.entries:
                self.waiting.updateValue((ident,), (waiting.dump(),))
            else:
                self.waiting.removeKey((ident,))
                emptied += 1
            for env in expired:
                yield to_row(self.complete(env, None, now_ms))
        meta = self.meta.get()
        if emptied and meta:
            # The records did not change, so the token (and every worker's cache) stays valid.
            self.meta.update((meta[0], max(0, meta[1] - emptied)))

    def close(self) -> None:
        pass

    # -- helpers
    def _lookup(self, env: dict, now_ms: int) -> Iterator[Row]:
        ident = env[self.id_field]
        if env["first_seen_ms"] is None:
            env["first_seen_ms"] = now_ms
        record = self.records.get(ident)
        outcome = rules.lookup_outcome(record is not None, now_ms - env["first_seen_ms"], self.max_wait_ms)
        if outcome == rules.WAIT:
            held = self.waiting.getValue((ident,))
            if held is None:
                self.records.add_waiting(1)
            waiting = rules.WaitingOrders.load(held[0] if held else None)
            waiting.add(env)
            self.waiting.updateValue((ident,), (waiting.dump(),))
            due = rules.deadline_ms(env["first_seen_ms"], self.max_wait_ms)
            self.handle.registerTimer(-(-due // TIMER_GRANULARITY_MS) * TIMER_GRANULARITY_MS)
            return
        yield to_row(self.complete(env, record, now_ms))

    def _release(self, ident: int, record: dict, now_ms: int) -> Iterator[Row]:
        """Orders that waited for this id are completed now that its state arrived."""
        if not self.waiting.containsKey((ident,)):
            return
        held = self.waiting.getValue((ident,))
        self.waiting.removeKey((ident,))
        self.records.add_waiting(-1)
        for env in rules.WaitingOrders.load(held[0] if held else None).entries:
            yield to_row(self.complete(env, record, now_ms))


class UserLookup(_Lookup):
    """Keyed by user bucket: attaches the latest user to each order, or marks it missing."""

    changelog, id_field = "users", "user_id"

    def complete(self, env: dict, record: dict | None, now_ms: int) -> dict:
        out = dict(env)
        out["user_record"] = record
        out["user_state"] = rules.FOUND if record is not None else rules.MISSING
        return out


class ItemLookup(_Lookup):
    """Keyed by item bucket: attaches the latest item and routes each order to its sink."""

    changelog, id_field = "items", "item_id"

    def complete(self, env: dict, record: dict | None, now_ms: int) -> dict:
        return rules.finish_order(env, record, now_ms)

    def pass_through(self, env: dict) -> dict:
        return rules.finish_dead(env)
