"""UserLookup and ItemLookup: thin transformWithStateInPandas glue around pipeline/enrich/rules.py.

Each lookup is grouped by a key *bucket* (``id % job.buckets``), so Spark calls the processor
once per bucket per batch, and every decision runs over a whole pandas frame of envelope rows.
Input arrives as chunks (pipeline/enrich/chunks.py), and both lookups emit chunks labelled by
item bucket: UserLookup's feed ItemLookup's grouping, and ItemLookup's hold the final envelope
rows the sinks write (so those 36 columns never pass through Spark's row format). The bucket's state (latest records, buffered orders) is a
:class:`~pipeline.enrich.bucket_state.BucketState`.

Call order per batch (Spark's): ``handleInputRows`` once per bucket with rows, then
``handleExpiredTimer`` once per expired processing-time timer. Inside ``handleInputRows`` the
bucket's changelog rows are applied before its orders are looked up (DESIGN.md §4). Rows a
lookup does not act on (dead letters, the other lookup's changelog) pass straight through.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Iterator

import numpy as np
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from pipeline.enrich import chunks, rules
from pipeline.enrich.bucket_state import BucketState

TIMER_GRANULARITY_MS = 100  # fewer distinct timers; an order may wait up to 100 ms longer
COLUMNS = list(rules.ENVELOPE_FIELDS)
# Slices share memory until written: frames here are sliced and given new columns a lot.
pd.set_option("mode.copy_on_write", True)


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame.from_records(rows, columns=COLUMNS)


class _Lookup(StatefulProcessor):
    """Shared lookup logic; subclasses say which changelog they hold and how an order completes."""

    changelog = ""  # "users" or "items"
    id_column = ""  # "user_id" or "item_id"

    def __init__(self, max_wait_ms: int):
        self.max_wait_ms = max_wait_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = BucketState(
            self.changelog, handle.getListState("latest", "token string, changes binary"),
            handle.getMapState("waiting", "id long", "orders binary"),
            handle.getValueState("meta", "token string"))

    # -- what differs between the two lookups
    @abstractmethod
    def complete(self, orders: pd.DataFrame, found: np.ndarray, now_ms: int) -> pd.DataFrame:
        """Orders whose lookup is done, with ``found`` telling which had their state."""

    def pass_through(self, frame: pd.DataFrame) -> pd.DataFrame:
        return frame

    def emit(self, frames: list[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        """The output of one callback: chunk rows ``(item_bucket, rows)`` (chunks.ITEM_CHUNKS)."""
        yield chunks.frames_by_bucket([frame[COLUMNS] for frame in frames], "item_bucket")

    # -- Spark callbacks
    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        frame = chunks.decode([blob for chunk in rows for blob in chunk["rows"]])
        op, kind = frame["op"].to_numpy(), frame["kind"].to_numpy()
        is_order = op == "order"
        is_change = (op == "upsert") | (op == "delete")
        passing = (op == "dead") | (is_change & (kind != self.changelog))
        out: list[pd.DataFrame] = []
        self.state.open(key[0])
        if passing.any():
            out.append(self.pass_through(frame[passing]))
        mine = is_change & ~passing
        if mine.any():
            # Only the changelog's order matters: orders are independent of one another.
            latest = rules.latest_changes(rules.in_apply_order(frame[mine]), self.id_column, self.changelog)
            self.state.apply(latest)
            released = self.state.release([ident for ident, values in latest.items() if values is not None])
            if released:
                out.append(self._found(_frame(released), now_ms))
        if is_order.any():
            out.extend(self._lookup(frame if is_order.all() else frame[is_order], now_ms))
        self.state.close()
        if out:
            yield from self.emit(out)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        self.state.open(key[0])
        expired = self.state.expire(now_ms, self.max_wait_ms)
        self.state.close()
        if expired:
            orders = _frame(expired)
            missing = np.zeros(len(orders), dtype=bool)
            yield from self.emit([self.complete(rules.attach_state(orders, [None] * len(orders), self.changelog),
                                                missing, now_ms)])

    def close(self) -> None:
        pass

    # -- helpers
    def _lookup(self, orders: pd.DataFrame, now_ms: int) -> Iterator[pd.DataFrame]:
        orders = orders.assign(first_seen_ms=orders["first_seen_ms"].fillna(now_ms))
        records = self.state.lookup_many(orders[self.id_column].tolist())
        found = np.fromiter((record is not None for record in records), dtype=bool, count=len(records))
        if self.max_wait_ms > 0 and not found.all():
            waits = ~found & (now_ms - orders["first_seen_ms"].to_numpy() < self.max_wait_ms)
            if waits.any():
                self._hold(orders[waits])
                orders, found = orders[~waits], found[~waits]
                records = [record for record, held in zip(records, waits) if not held]
        if len(orders):
            yield self.complete(rules.attach_state(orders, records, self.changelog), found, now_ms)

    def _hold(self, orders: pd.DataFrame) -> None:
        for ident, group in orders.groupby(self.id_column, sort=False):
            self.state.hold(int(ident), group[COLUMNS].to_dict("records"))
        deadlines = orders["first_seen_ms"].astype("int64") + self.max_wait_ms
        for due in set((-(-deadlines // TIMER_GRANULARITY_MS) * TIMER_GRANULARITY_MS).tolist()):
            self.handle.registerTimer(int(due))

    def _found(self, orders: pd.DataFrame, now_ms: int) -> pd.DataFrame:
        """Buffered orders released because their id's state just arrived."""
        records = self.state.lookup_many(orders[self.id_column].tolist())
        found = np.ones(len(orders), dtype=bool)
        return self.complete(rules.attach_state(orders, records, self.changelog), found, now_ms)


class UserLookup(_Lookup):
    """Keyed by user bucket: attaches the latest user to each order, or marks it missing."""

    changelog, id_column = "users", "user_id"

    def complete(self, orders: pd.DataFrame, found: np.ndarray, now_ms: int) -> pd.DataFrame:
        return rules.finish_user(orders, found)


class ItemLookup(_Lookup):
    """Keyed by item bucket: attaches the latest item and routes each order to its sink."""

    changelog, id_column = "items", "item_id"

    def complete(self, orders: pd.DataFrame, found: np.ndarray, now_ms: int) -> pd.DataFrame:
        return rules.finish_orders(orders, found, now_ms)

    def pass_through(self, frame: pd.DataFrame) -> pd.DataFrame:
        return rules.finish_dead(frame)
