"""A factory of realistic data dirs for the console's tests and benchmark, in the on-disk contract.

:func:`write_data_dir` writes what a run of the job leaves behind: the three Parquet sinks
as Delta tables, one commit per batch with the job's transaction identifier (through the job's
own :class:`pipeline.sinks.DeltaSinks`, the contract's types), and the ``progress``, ``tasks`` and ``events`` JSON Lines of the metrics store,
ending in a half-written line as a live job would. Everything is derived from one seeded random stream,
so the same arguments give the same files; sizes scale from a few hundred rows (tests) to
millions (bench/bench_console.py).

The story the data tells: the job started, ran ``batches`` micro-batches one trigger
interval apart up to ``now_ms``, restarted once (attempt 1/5), took a savepoint, replayed
the items topic (finished), started a replay of the users topic (still running), and
re-drove a few missing orders, some of which then got enriched. Early on a burst of user
updates filled the batch cap: one batch held the orders back, the next two gave them a share
anyway (``job.orders_share_after`` = 1), with their start and end events. Each topic of each
batch says what the planner admitted (messages and bytes, as it estimated them).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import pyarrow.parquet as pq

from pipeline import sinks, store

TS = pa.timestamp("us", tz="UTC")
ORDERS_TOPIC = "persistent://public/default/orders"
USERS_TOPIC = "persistent://public/default/users"
STAGES = ("user_lookup", "item_lookup")
MESSAGE_BYTES = {"orders": 310, "users": 240, "items": 190}  # the planner's price of a message, per topic
REASONS = np.array(["user", "item", "user_and_item"])
CATEGORIES = np.array(["books", "garden", "toys", "kitchen", "music", "sports"])
NAMES = np.array(["Ada", "Grace", "Linus", "Barbara", "Ken", "Margaret", "Dennis", "Frances"])
SURNAMES = np.array(["Lovelace", "Hopper", "Torvalds", "Liskov", "Thompson", "Hamilton", "Ritchie", "Allen"])

ENRICHED_SCHEMA = pa.schema([
    ("invoice_id", pa.int64()), ("line_item_id", pa.int64()), ("user_id", pa.int64()), ("item_id", pa.int64()),
    ("price", pa.float64()), ("created_at", TS), ("paid_at", TS),
    ("user_first_name", pa.string()), ("user_last_name", pa.string()), ("user_email", pa.string()),
    ("user_created_at", TS), ("item_name", pa.string()), ("item_category", pa.string()),
    ("item_adjective", pa.string()), ("item_modifier", pa.string()), ("item_price", pa.float64()),
    ("waited_ms", pa.int64()), ("published_at", TS), ("enriched_at", TS), ("batch_id", pa.int64()),
    ("source_topic", pa.string()), ("source_partition", pa.int32()), ("source_message_id", pa.string()),
    ("redrive_of", pa.string()),
])
MISSING_SCHEMA = pa.schema([
    ("invoice_id", pa.int64()), ("line_item_id", pa.int64()), ("user_id", pa.int64()), ("item_id", pa.int64()),
    ("item_name", pa.string()), ("item_category", pa.string()), ("price", pa.float64()),
    ("created_at", TS), ("paid_at", TS), ("reason", pa.string()), ("waited_ms", pa.int64()),
    ("published_at", TS), ("detected_at", TS), ("batch_id", pa.int64()), ("source_topic", pa.string()),
    ("source_partition", pa.int32()), ("source_message_id", pa.string()), ("redrive_of", pa.string()),
])
DEAD_LETTER_SCHEMA = pa.schema([
    ("source_topic", pa.string()), ("source_partition", pa.int32()), ("source_message_id", pa.string()),
    ("key", pa.string()), ("payload", pa.string()), ("error", pa.string()),
    ("published_at", TS), ("detected_at", TS), ("batch_id", pa.int64()),
])


@dataclass
class FixtureSummary:
    """What was written, for tests that want to name a known row."""

    data_dir: Path
    now_ms: int
    batches: int
    enriched_rows: int = 0
    missing_rows: int = 0
    dead_letter_rows: int = 0
    missing_example: dict = field(default_factory=dict)
    shared_orders: int = 0  # orders admitted while the changelogs filled the cap
    redriven_message_ids: list[str] = field(default_factory=list)


def write_data_dir(
    data_dir: Path,
    *,
    batches: int = 30,
    orders_per_batch: int = 40,
    users: int = 500,
    items: int = 80,
    trigger_interval_ms: int = 1000,
    partitions: int = 2,
    tasks_per_stage: int = 4,
    now_ms: int | None = None,
    seed: int = 7,
) -> FixtureSummary:
    """Write a data dir whose newest batch ended ``now_ms`` minus half a trigger interval."""
    data_dir = Path(data_dir)
    rng = np.random.default_rng(seed)
    now_ms = int(time.time() * 1000) if now_ms is None else int(now_ms)
    first_ts = now_ms - trigger_interval_ms // 2 - (batches - 1) * trigger_interval_ms
    summary = FixtureSummary(data_dir=data_dir, now_ms=now_ms, batches=batches)
    unknown_user_base, unknown_item_base = users + 1_000_000, items + 1_000_000
    hot_users = max(1, users // 100)
    next_invoice = 100_000
    entry_by_partition = np.zeros(partitions, dtype=np.int64)
    missing_ids: list[str] = []
    progress, tasks = [], []
    positions = {"orders": 0, "users": users, "items": items}
    state_rows = {"user_lookup": int(users * 0.9), "item_lookup": int(items * 0.95)}
    restart_batch, savepoint_batch = batches * 2 // 5, batches // 2
    replay_items = (batches * 3 // 5, batches * 3 // 5 + max(2, batches // 10))
    replay_users_start = batches - max(3, batches // 10)
    marks: dict[str, int] = {}  # the items replay's last position, for its events
    # users fill the cap: the 1st batch holds the orders back, the 2nd and 3rd share (share_after = 1)
    burst = range(batches // 5, batches // 5 + 3)
    generations: dict[str, int] = {}

    for batch in range(batches):
        ts_ms = first_ts + batch * trigger_interval_ms
        slow = batch % 17 == 5  # a few slow batches, so backpressure shows LOW and HIGH
        duration_ms = int(rng.integers(2 * trigger_interval_ms, 3 * trigger_interval_ms)) if slow else int(rng.integers(150, 700))
        if batch % 23 == 11:
            duration_ms = int(trigger_interval_ms * 1.3)
        n = int(orders_per_batch)
        invoice_ids = np.arange(next_invoice, next_invoice + n, dtype=np.int64)
        next_invoice += n
        partition = rng.integers(0, partitions, n).astype(np.int32)
        entries = np.empty(n, dtype=np.int64)
        for p in range(partitions):
            mask = partition == p
            entries[mask] = entry_by_partition[p] + np.arange(mask.sum())
            entry_by_partition[p] += mask.sum()
        message_ids = np.array([f"{10 + p}:{e}:-1:0" for p, e in zip(partition, entries)])
        hot = rng.random(n) < 0.25
        user_id = np.where(hot, rng.integers(1, hot_users + 1, n), rng.integers(1, users + 1, n)).astype(np.int64)
        item_id = np.where(rng.random(n) < 0.2, rng.integers(1, 4, n), rng.integers(1, items + 1, n)).astype(np.int64)
        outcome = rng.random(n)
        is_dead = outcome < 0.01
        is_missing = (outcome >= 0.01) & (outcome < 0.06)
        is_enriched = ~(is_dead | is_missing)
        # One order in ten waited in the buffer for its user or item; missing ones waited max_wait.
        waited_ms = np.where(rng.random(n) < 0.1, rng.integers(1, 5000, n), 0).astype(np.int64)
        waited_ms[is_missing] = 10_000
        published_ms = ts_ms - rng.integers(0, trigger_interval_ms, n) - waited_ms
        created_ms = published_ms - rng.integers(5, 200, n)
        committed_ms = ts_ms + duration_ms

        # enriched: {"invoice_id": 100123, "user_id": 7, "item_name": "item 12", "enriched_at": …}
        e = is_enriched
        k = int(e.sum())
        redrive_of = np.full(k, None, dtype=object)
        if missing_ids and batch % 4 == 0:
            # Re-drives of earlier missing orders come back enriched against today's state.
            picked = missing_ids[: min(2, len(missing_ids), k)]
            redrive_of[: len(picked)] = picked
            summary.redriven_message_ids.extend(picked)
            del missing_ids[: len(picked)]
        enriched = {
            "invoice_id": invoice_ids[e], "line_item_id": np.ones(k, dtype=np.int64),
            "user_id": user_id[e], "item_id": item_id[e], "price": np.round(rng.uniform(1, 200, k), 2),
            "created_at": _ts(created_ms[e]), "paid_at": _ts(np.where(rng.random(k) < 0.7, created_ms[e] + 1000, -1)),
            "user_first_name": NAMES[user_id[e] % len(NAMES)], "user_last_name": SURNAMES[user_id[e] % len(SURNAMES)],
            "user_email": np.char.add(np.char.add("user", user_id[e].astype(str)), "@example.com"),
            "user_created_at": _ts(np.full(k, first_ts - 86_400_000)),
            "item_name": np.char.add("item ", item_id[e].astype(str)), "item_category": CATEGORIES[item_id[e] % len(CATEGORIES)],
            "item_adjective": np.full(k, "shiny"), "item_modifier": np.full(k, "deluxe"),
            "item_price": np.round(rng.uniform(1, 200, k), 2), "waited_ms": waited_ms[e],
            "published_at": _ts(published_ms[e]), "enriched_at": _ts(np.full(k, committed_ms)),
            "batch_id": np.full(k, batch, dtype=np.int64), "source_topic": np.full(k, ORDERS_TOPIC),
            "source_partition": partition[e], "source_message_id": message_ids[e], "redrive_of": redrive_of,
        }
        published = []  # the (sink, batch) commits of this batch
        if _write_batch(data_dir, "enriched", batch, enriched, ENRICHED_SCHEMA):
            published.append(("enriched", batch))

        # missing_state: {"invoice_id": 100140, "reason": "user", "user_id": 1000512, …}
        m = is_missing
        j = int(m.sum())
        reason = REASONS[rng.integers(0, 3, j)]
        unknown_user = np.isin(reason, ["user", "user_and_item"])
        unknown_item = np.isin(reason, ["item", "user_and_item"])
        # Half the missing users are ones that show up later (ids in the known range).
        m_user = np.where(unknown_user & (rng.random(j) < 0.5), unknown_user_base + rng.integers(0, 20, j), user_id[m])
        m_item = np.where(unknown_item & (rng.random(j) < 0.5), unknown_item_base + rng.integers(0, 10, j), item_id[m])
        missing = {
            "invoice_id": invoice_ids[m], "line_item_id": np.ones(j, dtype=np.int64), "user_id": m_user, "item_id": m_item,
            "item_name": np.char.add("item ", m_item.astype(str)), "item_category": CATEGORIES[m_item % len(CATEGORIES)],
            "price": np.round(rng.uniform(1, 200, j), 2), "created_at": _ts(created_ms[m]), "paid_at": _ts(np.full(j, -1)),
            "reason": reason, "waited_ms": waited_ms[m], "published_at": _ts(published_ms[m]),
            "detected_at": _ts(np.full(j, committed_ms)), "batch_id": np.full(j, batch, dtype=np.int64),
            "source_topic": np.full(j, ORDERS_TOPIC), "source_partition": partition[m],
            "source_message_id": message_ids[m], "redrive_of": np.full(j, None, dtype=object),
        }
        if _write_batch(data_dir, "missing_state", batch, missing, MISSING_SCHEMA):
            published.append(("missing_state", batch))
        missing_ids.extend(message_ids[m].tolist())
        if j and not summary.missing_example:
            summary.missing_example = {"invoice_id": int(invoice_ids[m][0]), "user_id": int(m_user[0]), "item_id": int(m_item[0])}

        # dead_letter: {"payload": "{\"invoiceId\": \"x\"}", "error": "field 'invoiceId': expected an integer, got 'x'", …}
        d = is_dead
        i = int(d.sum())
        dead = {
            "source_topic": np.full(i, ORDERS_TOPIC), "source_partition": partition[d], "source_message_id": message_ids[d],
            "key": invoice_ids[d].astype(str), "payload": np.full(i, '{"invoiceId": "x"}'),
            "error": np.full(i, "field 'invoiceId': expected an integer, got 'x'"), "published_at": _ts(published_ms[d]),
            "detected_at": _ts(np.full(i, committed_ms)), "batch_id": np.full(i, batch, dtype=np.int64),
        }
        if _write_batch(data_dir, "dead_letter", batch, dead, DEAD_LETTER_SCHEMA):
            published.append(("dead_letter", batch))
        summary.enriched_rows += k
        summary.missing_rows += j
        summary.dead_letter_rows += i

        # metrics: one progress row, one task row per task of each stateful stage
        changelog_rows = {"users": int(rng.integers(0, 5)), "items": int(rng.integers(0, 3))}
        if replay_items[0] <= batch < replay_items[1]:
            changelog_rows["items"] += items // (replay_items[1] - replay_items[0])
        if batch >= replay_users_start:
            changelog_rows["users"] += max(1, users // 20)
        held_for = batch - burst.start + 1 if batch in burst else 0
        if held_for:
            changelog_rows["users"] += users // 5
        backlog_orders = int(n * (3 if slow else 0.2))
        # A replay is a new generation numbered by its seq; positions count from 0 within it.
        if batch == replay_items[0]:
            generations["items"], positions["items"] = 1, 0
        if batch == replay_users_start:
            generations["users"], positions["users"] = 2, 0
        topics = []
        orders_read = 0 if held_for == 1 else n  # a held batch reads no order (its sink rows stand for orders read before)
        if held_for > 1:
            summary.shared_orders += n
        for topic, rows in (("orders", n), ("users", changelog_rows["users"]), ("items", changelog_rows["items"])):
            partitions_read = _split(rows, partitions if topic == "orders" else 1, rng)
            if topic == "orders" and orders_read != n:
                rows, partitions_read = orders_read, [{**part, "rows": 0} for part in partitions_read]
            positions[topic] += rows
            backlog = backlog_orders if topic == "orders" else 0
            latest = positions[topic] + backlog
            if topic == "users" and batch >= replay_users_start:
                latest = max(latest, users)  # the replay still has to re-read every user
            if batch == 0:
                latest = None  # the job's first batch does not know the broker's latest position yet
            topics.append({
                "topic": topic, "generation": generations.get(topic, 0), "rows": rows, "end_position": positions[topic],
                "latest_position": latest,
                "backlog": None if latest is None or topic == "items" else latest - positions[topic],
                "replaying": topic == "users" and batch >= replay_users_start
                             or topic == "items" and replay_items[0] <= batch < replay_items[1] - 1,
                # the planner's estimates: a little off the messages read, priced per topic
                "admitted_messages": rows + rows // 20, "admitted_bytes": (rows + rows // 20) * MESSAGE_BYTES[topic],
                "partitions": partitions_read,
            })
        if batch == replay_items[1] - 1:
            marks["items_end"] = positions["items"]
        for stage in STAGES:
            state_rows[stage] += int(rng.integers(0, 3))
        state = [
            {"operator": stage, "rows_total": state_rows[stage], "rows_updated": int(rng.integers(0, 10)),
             "memory_bytes": state_rows[stage] * 350, "commit_ms": int(rng.integers(5, 40)),
             # Spark 4's names, some with and some without "Ms"; the changelog writer is not a commit phase.
             "custom": {"rocksdbCommitFlushLatency": int(rng.integers(0, 5)),
                        "rocksdbCommitCheckpointLatency": int(rng.integers(1, 20)),
                        "rocksdbCommitFileSyncLatencyMs": int(rng.integers(5, 50)),
                        "rocksdbChangeLogWriterCommitLatencyMs": int(rng.integers(5, 50)),
                        "rocksdbTotalBytesWrittenByFlush": int(rng.integers(0, 4096)),
                        "rocksdbSstFileSize": state_rows[stage] * 120}}
            for stage in STAGES
        ]
        progress.append({
            "ts": _iso(ts_ms), "ts_ms": ts_ms, "query_id": "3f1c0a6e-query", "run_id": "run-1" if batch < restart_batch else "run-2",
            "batch_id": batch, "num_input_rows": orders_read + changelog_rows["users"] + changelog_rows["items"],
            "input_rows_per_second": round(n / (trigger_interval_ms / 1000), 2),
            "processed_rows_per_second": round(n / (duration_ms / 1000), 2),
            "trigger_interval_ms": trigger_interval_ms, "batch_duration_ms": duration_ms,
            "duration_ms": {"latestOffset": 3, "getBatch": 1, "queryPlanning": 12, "addBatch": duration_ms - 40,
                            "walCommit": 9, "commitOffsets": 8, "triggerExecution": duration_ms},
            "topics": topics, "orders_held": held_for == 1, "orders_shared": held_for > 1, "orders_held_for": held_for,
            "state": state,
            "sink_rows": {"enriched": k, "missing_state": j, "dead_letter": i},
            "state_size_bytes": sum(row["custom"]["rocksdbSstFileSize"] for row in state),
        })
        for stage_id, stage in enumerate(STAGES, start=3):
            # Task 0 holds the hot keys, so records skew towards it.
            weights = np.ones(tasks_per_stage)
            weights[0] = 3.0
            records = _split(n, tasks_per_stage, rng, weights)
            for task, share in enumerate(records):
                tasks.append({"ts_ms": ts_ms + duration_ms, "batch_id": batch, "stage": stage, "stage_id": stage_id,
                              "task": task, "records": share["rows"], "duration_ms": 5 + share["rows"] // 4})

    events = _story_events(first_ts, trigger_interval_ms, restart_batch, savepoint_batch, replay_items, replay_users_start, marks)
    share_ts = first_ts + (burst.start + 1) * trigger_interval_ms
    events += [
        _event(share_ts + 300, "orders_share_started", f"the changelogs filled the batch cap for 2 batches in a row: "
               f"orders now get a share anyway (from batch {burst.start + 1})", {"batch_id": burst.start + 1, "held_for": 2}),
        _event(share_ts + 2 * trigger_interval_ms + 300, "orders_share_ended",
               f"the changelogs no longer fill the batch cap: {summary.shared_orders} orders were admitted while they "
               f"filled it (batches {burst.start + 1}-{burst.stop - 1}, 3 in a row at most)",
               {"started_batch": burst.start + 1, "last_batch": burst.stop - 1, "batch_id": burst.stop, "batches": 2,
                "held_for": 3, "orders": summary.shared_orders, "orders_held": False}),
    ]
    _write_jsonl(data_dir, "progress", progress, half_written_tail='{"ts": "2026-')
    _write_jsonl(data_dir, "tasks", tasks)
    _write_jsonl(data_dir, "events", events)
    return summary


def write_empty_data_dir(data_dir: Path) -> Path:
    """A data dir the job has not touched yet (only the folder)."""
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    return Path(data_dir)


def _story_events(first_ts, interval, restart_batch, savepoint_batch, replay_items, replay_users_start, marks):
    at = lambda batch: first_ts + batch * interval  # noqa: E731 - a timeline helper
    return [
        _event(first_ts - 2000, "job_started", "job started (run-1)", {"run_id": "run-1"}),
        _event(at(restart_batch) - 900, "restart", "restart 1/5 after: broker connection lost",
               {"attempt": 1, "max_attempts": 5, "error": "PulsarException: connection lost", "delay_s": 10.0}),
        _event(at(restart_batch) - 100, "job_started", "job started (run-2)", {"run_id": "run-2"}),
        _event(at(savepoint_batch) + 300, "savepoint_taken", "savepoint 'before-replay' at batch %d" % savepoint_batch,
               {"name": "before-replay", "batch_id": savepoint_batch, "size_bytes": 183_500}),
        _event(at(replay_items[0]) - 800, "replay_requested", "replay #1 of items requested from earliest",
               {"seq": 1, "topic": "items", "from": "earliest", "requested_by": "console"}),
        _event(at(replay_items[0]) - 200, "replay_started", "replay #1 of items started",
               {"seq": 1, "topic": "items", "from": "earliest", "target_position": marks["items_end"]}),
        _event(at(replay_items[1]) + 400, "replay_finished", "replay #1 of items finished",
               {"seq": 1, "topic": "items", "messages": marks["items_end"], "duration_ms": (replay_items[1] - replay_items[0]) * interval}),
        _event(at(replay_items[1]) + 2000, "redrive", "re-drove 4 missing-state orders",
               {"count": 4, "requested_by": "console", "selector": {"reason": "user"}}),
        _event(at(replay_users_start) - 700, "replay_requested", "replay #2 of users requested from 2026-11-21T00:00:00Z",
               {"seq": 2, "topic": "users", "from": "2026-11-21T00:00:00Z", "requested_by": "cli"}),
        _event(at(replay_users_start) - 300, "replay_started", "replay #2 of users started",
               # As the job writes it today: no target position yet, so the console falls back on latest_position.
               {"seq": 2, "topic": "users", "target_position": None}),
    ]


def _event(ts_ms: int, kind: str, message: str, details: dict) -> dict:
    return {"ts": _iso(ts_ms), "ts_ms": int(ts_ms), "kind": kind, "message": message, "details": details}


def _split(total: int, parts: int, rng: np.random.Generator, weights: np.ndarray | None = None) -> list[dict]:
    """``total`` rows over ``parts`` partitions: ``[{"partition": 0, "rows": 12}, …]``."""
    weights = np.ones(parts) if weights is None else weights
    counts = rng.multinomial(total, weights / weights.sum()) if total else np.zeros(parts, dtype=int)
    return [{"partition": p, "rows": int(c)} for p, c in enumerate(counts)]


def _ts(epoch_ms: np.ndarray) -> pa.Array:
    """Timestamps in UTC from epoch ms; negative means none (NULL)."""
    values = np.asarray(epoch_ms, dtype=np.int64)
    return pa.array(values * 1000, type=pa.int64(), mask=values < 0).cast(TS)


def _write_batch(data_dir: Path, sink: str, batch: int, columns: dict, schema: pa.Schema) -> bool:
    """Commit one batch to a sink's Delta table; False (and no commit) for a batch with no rows, as the job does."""
    if len(next(iter(columns.values()))) == 0:
        return False
    table = pa.table({name: pa.array(columns[name], type=schema.field(name).type) if not isinstance(columns[name], pa.Array)
                      else columns[name] for name in schema.names}, schema=schema)
    sinks.DeltaSinks({sink: store.sink_dir(data_dir, sink)}).commit_batch({sink: table}, batch)
    return True


def _write_jsonl(data_dir: Path, stream: str, rows: list[dict], half_written_tail: str = "") -> None:
    folder = store.metrics_dir(data_dir, stream)
    folder.mkdir(parents=True, exist_ok=True)
    by_day: dict[str, list[str]] = {}
    for row in rows:
        by_day.setdefault(_day(row["ts_ms"]), []).append(json.dumps(row))
    for day, lines in sorted(by_day.items()):
        (folder / f"{day}.jsonl").write_text("\n".join(lines) + "\n")
    if half_written_tail and by_day:
        with (folder / f"{max(by_day)}.jsonl").open("a") as handle:
            handle.write(half_written_tail)


def _day(ts_ms: int) -> str:
    return datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d")


def _iso(ts_ms: int) -> str:
    return datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# ------------------------------------------------------------------ pytest fixtures
# Imported by the console's test modules (pytest picks up fixtures a module imports).


@pytest.fixture(scope="session")
def fixture_data(tmp_path_factory) -> FixtureSummary:
    """One realistic data dir for the whole session; tests only read it."""
    return write_data_dir(tmp_path_factory.mktemp("console") / "data")


@pytest.fixture
def empty_data_dir(tmp_path) -> Path:
    """A data dir the job has not written to."""
    return write_empty_data_dir(tmp_path / "empty")


def read_sink(data_dir: Path, sink: str):
    """A whole sink as pandas, read with pyarrow (independently of the console's DuckDB SQL)."""
    import pandas as pd

    files = sinks.sink_files(data_dir, sink)
    return pd.concat([pq.read_table(path).to_pandas() for path in files], ignore_index=True)


def read_metrics(data_dir: Path, stream: str) -> list[dict]:
    """Every complete line of a metrics stream, parsed with json (half-written lines skipped)."""
    rows = []
    for path in sorted(store.metrics_dir(data_dir, stream).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows
