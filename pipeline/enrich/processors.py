"""UserLookup and ItemLookup: thin transformWithStateInPandas glue around pipeline/enrich/rules.py.

Each lookup is grouped by a key *bucket* (``id % job.buckets``), so Spark calls the processor
once per bucket per batch with pandas frames of envelope rows, and every decision runs over a
whole frame. The bucket's state (latest records, buffered orders) is a
:class:`~pipeline.enrich.bucket_state.BucketState`.

Call order per batch (Spark's): ``handleInputRows`` once per bucket with rows, then
``handleExpiredTimer`` once per expired processing-time timer. Inside ``handleInputRows`` the
bucket's changelog rows are applied before its orders are looked up (DESIGN.md §4). Rows a
lookup does not act on (dead letters, the other lookup's changelog) pass straight through.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Iterator

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from pipeline.enrich import rules
from pipeline.enrich.bucket_state import BucketState

TIMER_GRANULARITY_MS = 100  # fewer distinct timers; an order may wait up to 100 ms longer
COLUMNS = list(rules.ENVELOPE_FIELDS)


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
            self.changelog, handle.getListState("latest", "id long, record binary"),
            handle.getMapState("waiting", "id long", "orders binary"),
            handle.getValueState("meta", "token string, log_size long"))

    # -- what differs between the two lookups
    @abstractmethod
    def complete(self, orders: pd.DataFrame, found: pd.Series, now_ms: int) -> pd.DataFrame:
        """Orders whose lookup is done, with ``found`` telling which had their state."""

    def pass_through(self, frame: pd.DataFrame) -> pd.DataFrame:
        return frame

    # -- Spark callbacks
    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        frames = [frame for frame in rows if len(frame)]
        if not frames:
            return
        frame = rules.in_apply_order(pd.concat(frames, ignore_index=True))
        self.state.open(key[0])
        passing = rules.passes_through(frame, self.changelog).to_numpy()
        if passing.any():
            yield self.pass_through(frame[passing])[COLUMNS]
        is_order = (frame["op"] == "order").to_numpy()
        changes = frame[~passing & ~is_order]
        if len(changes):
            latest = rules.latest_changes(changes, self.id_column, self.changelog)
            self.state.apply(latest)
            released = self.state.release([ident for ident, values in latest.items() if values is not None])
            if released:
                yield self._found(_frame(released), now_ms)
        if is_order.any():
            yield from self._lookup(frame[is_order], now_ms)
        self.state.close()

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        self.state.open(key[0])
        expired = self.state.expire(now_ms, self.max_wait_ms)
        self.state.close()
        if expired:
            orders = _frame(expired)
            missing = pd.Series(False, index=orders.index)
            yield self.complete(rules.attach_state(orders, [None] * len(orders), self.changelog), missing,
                                now_ms)[COLUMNS]

    def close(self) -> None:
        pass

    # -- helpers
    def _lookup(self, orders: pd.DataFrame, now_ms: int) -> Iterator[pd.DataFrame]:
        orders = orders.copy()
        orders["first_seen_ms"] = orders["first_seen_ms"].fillna(now_ms)
        records = self.state.lookup_many(orders[self.id_column].tolist())
        found = pd.Series([record is not None for record in records], index=orders.index)
        if self.max_wait_ms > 0 and not found.all():
            waits = (~found & (now_ms - orders["first_seen_ms"] < self.max_wait_ms)).to_numpy()
            if waits.any():
                self._hold(orders[waits])
                orders, found = orders[~waits], found[~waits]
                records = [record for record, held in zip(records, waits) if not held]
        if len(orders):
            yield self.complete(rules.attach_state(orders, records, self.changelog), found, now_ms)[COLUMNS]

    def _hold(self, orders: pd.DataFrame) -> None:
        for ident, group in orders.groupby(self.id_column, sort=False):
            self.state.hold(int(ident), group[COLUMNS].to_dict("records"))
        deadlines = orders["first_seen_ms"].astype("int64") + self.max_wait_ms
        for due in set((-(-deadlines // TIMER_GRANULARITY_MS) * TIMER_GRANULARITY_MS).tolist()):
            self.handle.registerTimer(int(due))

    def _found(self, orders: pd.DataFrame, now_ms: int) -> pd.DataFrame:
        """Buffered orders released because their id's state just arrived."""
        records = self.state.lookup_many(orders[self.id_column].tolist())
        found = pd.Series(True, index=orders.index)
        return self.complete(rules.attach_state(orders, records, self.changelog), found, now_ms)[COLUMNS]


class UserLookup(_Lookup):
    """Keyed by user bucket: attaches the latest user to each order, or marks it missing."""

    changelog, id_column = "users", "user_id"

    def complete(self, orders: pd.DataFrame, found: pd.Series, now_ms: int) -> pd.DataFrame:
        return rules.finish_user(orders, found)


class ItemLookup(_Lookup):
    """Keyed by item bucket: attaches the latest item and routes each order to its sink."""

    changelog, id_column = "items", "item_id"

    def complete(self, orders: pd.DataFrame, found: pd.Series, now_ms: int) -> pd.DataFrame:
        return rules.finish_orders(orders, found, now_ms)

    def pass_through(self, frame: pd.DataFrame) -> pd.DataFrame:
        return rules.finish_dead(frame)
