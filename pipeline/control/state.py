"""State inspection: what the job holds, read from its checkpoint with Spark's state data source.

- :func:`inspect_key`: one key of one lookup: its latest record and the orders waiting for it
  (``python -m pipeline state users 42``).
- :func:`serve_lookups`: the same for a stream of requests on one Spark session
  (``python -m pipeline state --serve``: the console's look-up worker, pipeline/control/state_service.py).
- :func:`count_waiting`: keys with waiting orders and the orders, per lookup, at one batch.
- :class:`StateCensus`: the job's background thread that turns Spark's own state metrics into
  ``keys held`` and ``orders waiting`` per lookup (the ``state`` stream of the metrics store).

Spark's ``numRowsTotal`` of a lookup counts one row per key per state variable, and it has no
count per variable. In processing time the variables are ``latest`` and ``waiting``: the keys
held are the rows less the keys with waiting orders (the census reads ``waiting``). In event
time (VersionedLookup) a key with two versions or more has a ``head`` row and a ``versions`` row,
so the rows less the waiting keys would count it twice: the census reads the ``head`` variable
alone, whose one row per key says whether its newest version is a record and how many orders
wait. Every read here is of committed state only; nothing is written to the checkpoint, so it
is safe while the job runs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline.enrich.lookups import LOOKUPS, Lookup
from pipeline.metrics import iso
from pipeline.sinks import last_committed_batch

log = logging.getLogger(__name__)
CENSUS_INTERVAL_S = 60.0  # each census loads the lookups' RocksDB state; once a minute at most


def operator_id(lookup: Lookup) -> int:
    """The lookup's state operator id: Spark numbers them from the top of the plan down, so
    the last lookup is 0."""
    return len(LOOKUPS) - 1 - LOOKUPS.index(lookup)


@dataclass
class KeyState:
    """What one lookup holds for one key at a committed batch."""

    lookup: str
    key: int
    batch_id: int
    latest: dict | None = None  # the record's state columns, None when nothing is held
    waiting: list[dict] = field(default_factory=list)  # waiting orders: invoice_id, first_seen_ms, …
    # Event time only: every version held, oldest first ({"version_ms", "tombstone", state columns}).
    versions: list[dict] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str)

    def describe(self) -> str:
        """A few lines for a person."""
        if self.batch_id < 0:
            return f"{self.lookup} {self.key}: the job has committed no batch yet"
        lines = [f"{self.lookup} {self.key} at batch {self.batch_id}:"]
        if self.latest is None:
            lines.append("  latest: nothing held (never seen, or deleted by a tombstone)")
        else:
            lines.append("  latest: " + ", ".join(f"{k}={v!r}" for k, v in self.latest.items()))
        for version in self.versions or []:
            state = ", ".join(f"{k}={v!r}" for k, v in version.items() if k not in ("version_ms", "tombstone"))
            lines.append(f"  version as of {iso(version['version_ms'])}: " + ("deleted (tombstone)" if version["tombstone"] else state))
        lines.append(f"  waiting: {len(self.waiting)} order(s)")
        lines += [f"    invoice {order['invoice_id']} (message {order['source_message_id']}), "
                  f"waiting since {iso(order['first_seen_ms'])}" for order in self.waiting]
        return "\n".join(lines)


def _reader(spark, checkpoint: Path, lookup: Lookup, variable: str, batch_id: int):
    return (spark.read.format("statestore").option("path", str(checkpoint))
            .option("operatorId", operator_id(lookup)).option("stateVarName", variable)
            .option("batchId", batch_id))


def _partition_of(spark, key: int, partitions: int) -> int:
    """The state partition of a key: Spark's hash partitioning of the grouping key."""
    from pyspark.sql import functions as F

    return spark.range(1).select(F.expr(f"pmod(hash(CAST({int(key)} AS BIGINT)), {partitions})")).first()[0]


def _partitions(spark, checkpoint: Path) -> int:
    metadata = spark.read.format("state-metadata").load(str(checkpoint)).collect()
    return max((row["numPartitions"] for row in metadata), default=1)


def inspect_key(spark, checkpoint: Path, lookup: Lookup, key: int) -> KeyState:
    """The latest record and the waiting orders of ``key`` in ``lookup`` at the newest commit."""
    batch_id = last_committed_batch(checkpoint)
    found = KeyState(lookup.changelog, int(key), batch_id)
    if batch_id < 0:
        return found
    partition = _partition_of(spark, key, _partitions(spark, checkpoint))
    if is_event_time(checkpoint):
        # Versions per key (VersionedLookup): the older ones in its list, the newest few in its
        # head; the newest is what a new order would see.
        rows = (_reader(spark, checkpoint, lookup, "versions", batch_id).option("partitionId", partition)
                .option("flattenCollectionTypes", "true").load().filter(f"key.value = {int(key)}")
                .select("list_element.*").collect())
        rows += (_reader(spark, checkpoint, lookup, "head", batch_id).option("partitionId", partition).load()
                 .filter(f"key.value = {int(key)}").selectExpr("explode(value.recent) AS version")
                 .select("version.*").collect())
        state_columns = list(lookup.state_columns)
        found.versions = sorted(({"version_ms": row["version_ms"], "tombstone": row["tombstone"],
                                  **{name: row[name] for name in state_columns}} for row in rows),
                                key=lambda version: version["version_ms"])
        newest = found.versions[-1] if found.versions else None
        found.latest = None if newest is None or newest["tombstone"] else \
            {name: newest[name] for name in state_columns}
    else:
        latest = (_reader(spark, checkpoint, lookup, "latest", batch_id).option("partitionId", partition).load()
                  .filter(f"key.value = {int(key)}").collect())
        if latest:
            found.latest = latest[0]["value"].asDict()
    waiting = (_reader(spark, checkpoint, lookup, "waiting", batch_id).option("partitionId", partition)
               .option("flattenCollectionTypes", "true").load().filter(f"key.value = {int(key)}")
               .select("list_element.*").collect())
    if found.versions is not None:
        # event time: the first waiting orders are in the key's head, the list holds the rest
        waiting = (_reader(spark, checkpoint, lookup, "head", batch_id).option("partitionId", partition).load()
                   .filter(f"key.value = {int(key)}").selectExpr("explode(value.queued) AS queued")
                   .select("queued.*").collect()) + waiting
    shown = ("invoice_id", "source_message_id", "first_seen_ms", *(each.id_column for each in LOOKUPS))
    found.waiting = [{name: row[name] for name in shown} for row in waiting]
    return found


def serve_lookups(spark, checkpoint: Path, lines, write) -> None:
    """``python -m pipeline state --serve``: answer look-up requests, one JSON line each, until
    ``lines`` ends (pipeline/control/state_service.py feeds them and describes the protocol).

    One Spark session serves every request; each reads the newest committed batch afresh.
    """
    from pipeline.enrich.lookups import lookup_named

    for line in lines:
        if not line.strip():
            continue
        request_id = None
        try:
            request = json.loads(line)
            request_id = request.get("id")
            targets = [(lookup_named(str(name)), int(key)) for name, key in request["keys"]]
            try:
                found = [asdict(inspect_key(spark, checkpoint, lookup, key)) for lookup, key in targets]
            except Exception as exc:
                # Spark's state reader can miss a commit the job is writing at that moment
                # (STDS_COMMITTED_BATCH_UNAVAILABLE, seen in bench/bench_state_lookup.py): once more.
                if "COMMITTED_BATCH_UNAVAILABLE" not in str(exc):
                    raise
                time.sleep(1.0)
                found = [asdict(inspect_key(spark, checkpoint, lookup, key)) for lookup, key in targets]
            answer = {"id": request_id, "found": found}
        except Exception as exc:  # one bad request never ends the worker
            answer = {"id": request_id, "error": " ".join(str(exc).split())[:500]}
        write(json.dumps(answer, default=str) + "\n")


def is_event_time(checkpoint: Path) -> bool:
    """Whether the job that wrote this checkpoint ran in event time (its layout marker says)."""
    from pipeline.runtime.supervisor import EVENT_TIME_LAYOUT

    marker = Path(checkpoint) / "layout"
    return marker.is_file() and marker.read_text().strip() == EVENT_TIME_LAYOUT


def count_heads(spark, checkpoint: Path, lookup: Lookup, batch_id: int) -> tuple[int, int, int]:
    """Event time: (keys whose newest version is a record, keys with waiting orders, waiting
    orders) of ``lookup`` after ``batch_id``, from the ``head`` variable only (one row per key;
    neither the versions lists nor the waiting orders are read)."""
    row = (_reader(spark, checkpoint, lookup, "head", batch_id).load()
           .selectExpr("count_if(NOT try_element_at(value.recent, -1).tombstone) AS held",
                       "count_if(value.waiting > 0) AS keys", "coalesce(sum(value.waiting), 0) AS orders").first())
    return int(row["held"]), int(row["keys"]), int(row["orders"])


def count_waiting(spark, checkpoint: Path, lookup: Lookup, batch_id: int) -> tuple[int, int]:
    """(keys with waiting orders, waiting orders) of ``lookup`` after ``batch_id``."""
    row = (_reader(spark, checkpoint, lookup, "waiting", batch_id).option("flattenCollectionTypes", "false").load()
           .selectExpr("count(*) AS keys", "coalesce(sum(size(list_value)), 0) AS orders").first())
    return int(row["keys"]), int(row["orders"])


class StateCensus:
    """Keys held and orders waiting per lookup, written to the metrics store's ``state`` stream.

    Runs on a daemon thread of the job (driver side): at most every ``interval_s`` it takes the
    checkpoint's newest committed batch, reads the lookups' ``waiting`` variables at that batch
    (skipped when ``max_wait_ms`` is 0: nothing ever waits; in event time their ``head``
    variables instead, see :func:`count_heads`) and appends one row per lookup::

        {"ts_ms": …, "batch_id": 41, "lookup": "users", "state_rows": 2801, "keys_held": 2780,
         "waiting_keys": 21, "waiting_orders": 35}

    The state rows of each batch come from its progress row, which the census follows as the
    listener appends it (:class:`pipeline.metrics_tail.StreamTail`): each census parses only
    the rows written since the last one, never the whole store.
    """

    KEEP_BATCHES = 1024  # state rows remembered per batch: the committed batch is among the newest

    def __init__(self, spark, checkpoint: Path, metrics_store, max_wait_ms: int, interval_s: float | None = None):
        from pipeline.metrics_tail import StreamTail

        self.spark, self.checkpoint, self.metrics = spark, Path(checkpoint), metrics_store
        self.max_wait_ms, self.interval_s = max_wait_ms, CENSUS_INTERVAL_S if interval_s is None else interval_s
        self._stop = threading.Event()
        self._last_batch = -1
        self._progress = StreamTail(metrics_store.data_dir, "progress", newest=self.KEEP_BATCHES)
        self._state_rows: dict[int, dict[str, int]] = {}  # batch id -> {operator: rows_total}, newest row wins
        self._thread = threading.Thread(target=self._run, name="state-census", daemon=True)

    def start(self) -> "StateCensus":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        # Without waiting orders every state row of processing time is a key held, so a census
        # costs nothing; event time reads its heads whatever max_wait is.
        interval = 1.0 if self.max_wait_ms == 0 and not is_event_time(self.checkpoint) else self.interval_s
        while not self._stop.wait(interval):
            try:
                self.take()
            except Exception as exc:  # a census is a figure for the console, never a reason to stop the job
                log.warning("state census skipped: %s", " ".join(str(exc).split())[:300])

    def take(self) -> list[dict]:
        """One census at the newest committed batch not counted yet; returns the rows written."""
        self._state_rows = remember_state_rows(self._state_rows, self._progress.read_new(), self.KEEP_BATCHES)
        # The checkpoint's newest commit, not the newest progress row: after a restore the metrics
        # store remembers batches the restored checkpoint never had.
        committed = last_committed_batch(self.checkpoint)
        rows_by_lookup = self._state_rows.get(committed)
        if rows_by_lookup is None or committed == self._last_batch:
            return []
        written = []
        event_time = is_event_time(self.checkpoint)
        for lookup in LOOKUPS:  # every lookup counted before any row is written: one census, whole
            name = f"{lookup.reason}_lookup"
            if name not in rows_by_lookup:
                continue
            now_ms = int(time.time() * 1000)
            if event_time:
                held, keys, orders = count_heads(self.spark, self.checkpoint, lookup, committed)
                row = census_row(lookup.changelog, committed, rows_by_lookup[name], keys, orders, now_ms)
                written.append({**row, "keys_held": held})
                continue
            keys, orders = (0, 0) if self.max_wait_ms == 0 else \
                count_waiting(self.spark, self.checkpoint, lookup, committed)
            written.append(census_row(lookup.changelog, committed, rows_by_lookup[name], keys, orders, now_ms))
        for row in written:
            self.metrics.append("state", row)
        self._last_batch = committed
        return written


def remember_state_rows(known: dict[int, dict[str, int]], progress_rows: list[dict], keep: int) -> dict[int, dict[str, int]]:
    """The state rows per operator of each batch, updated with newer progress rows (a batch that
    ran again after a restore takes its newest row), the ``keep`` highest batch ids only."""
    merged = dict(known)
    for row in progress_rows:
        if isinstance(row.get("batch_id"), int):
            merged[row["batch_id"]] = {op["operator"]: op["rows_total"] for op in row.get("state") or []}
    return dict(sorted(merged.items())[-keep:])


def census_row(lookup: str, batch_id: int, state_rows: int, waiting_keys: int, waiting_orders: int, ts_ms: int) -> dict:
    """One ``state`` row: in processing time Spark's state rows count a key with a record and a
    key with waiting orders alike, so the keys held are the rows less the keys waiting (event
    time replaces ``keys_held`` with its heads' count)."""
    return {"ts_ms": ts_ms, "batch_id": batch_id, "lookup": lookup, "state_rows": state_rows,
            "keys_held": max(0, state_rows - waiting_keys), "waiting_keys": waiting_keys,
            "waiting_orders": waiting_orders}
