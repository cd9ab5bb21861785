"""The metrics store: append-only JSON Lines of progress, tasks and events (DESIGN.md §6).

Files are ``<data_dir>/metrics/<stream>/<YYYY-MM-DD>.jsonl``. Each row is written with one
``write`` on a file opened for appending, so DuckDB can read while the job writes (a reader
may see a half line at the end and skips it). Nothing here holds a lock the console needs.

- :func:`build_progress_row` turns Spark's progress JSON into our row (pure).
- :func:`task_rows_from_stages` turns Spark's REST task lists into ``tasks`` rows (pure).
- :class:`MetricsStore` appends rows; :func:`read_events` reads them back for the job itself.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from pipeline import store
from pipeline.enrich.lookups import LOOKUPS
from pipeline.source.counts import rows_from_progress
from pipeline.source.offsets import replay_finished

# The lookups' stateful stages in plan order (the 1st and 2nd shuffle reads): user_lookup, item_lookup.
STATEFUL_STAGES = tuple(f"{lookup.reason}_lookup" for lookup in LOOKUPS)

# ------------------------------------------------------------------ the streams' columns
# Each stream's columns and types as its readers take them: the console's DuckDB views
# (app/sources.py METRIC_COLUMNS) are derived from these. A writer's row may carry more keys
# than its readers take (``ts``, a topic's ``replaying``); a key it leaves out reads as NULL.
DURATION_PHASES = ("latestOffset", "getBatch", "queryPlanning", "addBatch", "walCommit", "commitOffsets", "triggerExecution")
_INT = pa.int64()
_PARTITION_ROWS = pa.struct([("partition", _INT), ("rows", _INT)])
# topic_rows(): one per topic the batch read
_TOPIC = pa.struct([("topic", pa.string()), ("generation", _INT), ("rows", _INT), ("end_position", _INT),
                    ("latest_position", _INT), ("backlog", _INT), ("admitted_messages", _INT),
                    ("admitted_bytes", _INT), ("partitions", pa.list_(_PARTITION_ROWS))])
# build_progress_row(): one per stateful operator
_OPERATOR_STATE = pa.struct([("operator", pa.string()), ("rows_total", _INT), ("rows_updated", _INT),
                             ("memory_bytes", _INT), ("commit_ms", _INT), ("custom", pa.map_(pa.string(), pa.float64()))])
_WATERMARK_PARTITION = pa.struct([("partition", _INT), ("newest_ms", _INT), ("watermark_ms", _INT), ("idle", pa.bool_())])
STREAM_SCHEMAS: dict[str, pa.Schema] = {
    # build_progress_row() (and the SQL pipelines' pipeline/sql/progress.py): one row per micro-batch
    "progress": pa.schema([
        ("ts_ms", _INT), ("query_id", pa.string()), ("run_id", pa.string()), ("batch_id", _INT),
        ("num_input_rows", _INT), ("input_rows_per_second", pa.float64()),
        ("processed_rows_per_second", pa.float64()), ("trigger_interval_ms", _INT), ("batch_duration_ms", _INT),
        ("duration_ms", pa.struct([(phase, _INT) for phase in DURATION_PHASES])),
        ("topics", pa.list_(_TOPIC)),
        # Whether the planner held the orders back for the changelogs (NULL in rows from before it said).
        ("orders_held", pa.bool_()), ("orders_shared", pa.bool_()), ("orders_held_for", _INT),
        ("state", pa.list_(_OPERATOR_STATE)),
        ("sink_rows", pa.struct([(sink, _INT) for sink in store.SINKS])),
        ("state_size_bytes", _INT)]),
    # task_rows_from_stages()
    "tasks": pa.schema([("ts_ms", _INT), ("batch_id", _INT), ("stage", pa.string()), ("stage_id", _INT),
                        ("task", _INT), ("records", _INT), ("duration_ms", _INT)]),
    # MetricsStore.event()
    "events": pa.schema([("ts_ms", _INT), ("kind", pa.string()), ("message", pa.string()), ("details", pa.json_())]),
    # Keys held and orders waiting per lookup (pipeline/control/state.py's census).
    "state": pa.schema([("ts_ms", _INT), ("batch_id", _INT), ("lookup", pa.string()), ("state_rows", _INT),
                        ("keys_held", _INT), ("waiting_keys", _INT), ("waiting_orders", _INT)]),
    # Event time only: per batch, the job's watermark and each topic's (pipeline/enrich/event_clock.py).
    "watermarks": pa.schema([
        ("ts_ms", _INT), ("batch_id", _INT), ("watermark_ms", _INT),
        ("topics", pa.list_(pa.struct([
            ("topic", pa.string()), ("newest_ms", _INT), ("watermark_ms", _INT), ("lag_ms", _INT), ("idle", pa.bool_()),
            ("late_versions", _INT), ("partitions", pa.list_(_WATERMARK_PARTITION))])))]),
}


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


class MetricsStore:
    """Appends rows to the three metric streams; safe to call from several threads."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self._lock = threading.Lock()

    def append(self, stream: str, row: dict) -> None:
        folder = store.metrics_dir(self.data_dir, stream)
        ts = row.get("ts_ms") or now_ms()
        day = datetime.fromtimestamp(ts / 1000, tz=timezone.utc).strftime("%Y-%m-%d")
        line = json.dumps(row, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / f"{day}.jsonl", "a", encoding="utf-8") as handle:
                handle.write(line)

    def event(self, kind: str, message: str, **details) -> dict:
        ts = now_ms()
        row = {"ts": iso(ts), "ts_ms": ts, "kind": kind, "message": message, "details": details}
        self.append("events", row)
        return row


def read_rows(data_dir: Path, stream: str, since_ms: int | None = None) -> list[dict]:
    """All rows of a stream, oldest first, skipping a half-written last line; with ``since_ms``,
    only the day files from that day on (rows of that day before it included)."""
    rows = []
    folder = store.metrics_dir(data_dir, stream)
    first_day = None if since_ms is None else datetime.fromtimestamp(since_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d")
    for path in sorted(folder.glob("*.jsonl")) if folder.exists() else []:
        if first_day is not None and path.stem < first_day:
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def prune_old_days(data_dir: Path, retention_s: float, now_s: float | None = None) -> list[Path]:
    """Delete the day files of every metrics stream whose whole day ended more than
    ``retention_s`` ago; today's and yesterday's always stay (a day file is the unit). Returns
    what was deleted. The running job calls it on its maintenance thread (metrics.retention),
    for its own store and the SQL pipelines' (``<data_dir>/sql/<name>/metrics/``, so a stopped
    pipeline's rows expire too); a running SQL pipeline calls it for its own store."""
    now = time.time() if now_s is None else now_s
    keep_from = datetime.fromtimestamp(now - max(retention_s, 86400.0), tz=timezone.utc).strftime("%Y-%m-%d")
    pipelines = store.sql_pipelines_dir(data_dir)
    roots = [Path(data_dir)] + (sorted(path for path in pipelines.iterdir() if (path / "metrics").is_dir())
                                if pipelines.is_dir() else [])
    removed = []
    for root, stream in ((root, stream) for root in roots for stream in store.METRIC_STREAMS):
        folder = store.metrics_dir(root, stream)
        for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
            if len(path.stem) == 10 and path.stem < keep_from:
                try:
                    path.unlink()
                    removed.append(path)
                except FileNotFoundError:
                    continue
    return removed


def read_events(data_dir: Path, kinds: tuple[str, ...] = ()) -> list[dict]:
    return [row for row in read_rows(data_dir, "events") if not kinds or row.get("kind") in kinds]


def source_offset(text) -> dict:
    """A source's offset in a progress event (JSON text, or already parsed) as a dict; {} for none."""
    if not text:
        return {}
    return json.loads(text) if isinstance(text, str) else text


def topic_rows(start: dict, end: dict, latest: dict, counted: dict | None = None) -> list[dict]:
    """Per topic: the messages the batch read, and its positions and backlog in broker entries.

    ``rows`` (per topic and per partition) are the messages counted where they were read
    (``counted``, pipeline/source/counts.py); None for a partition that read entries but was not
    counted. ``end_position``, ``latest_position`` and ``backlog`` come from the source's offsets,
    which count entries (an unbatched message is one; a producer's batch is one): the driver plans
    without reading messages, so entries are what it knows. Apache Pulsar's own backlog counts
    entries too, unless its precise backlog is turned on. ``admitted_messages`` and
    ``admitted_bytes`` are what the planner admitted, as it estimated them before reading (the
    end offset's ``admitted``); None when the offset does not say (a checkpoint from before it did).
    """
    result = []
    for topic, end_topic in end.items():
        start_topic = start.get(topic) or {}
        same_gen = start_topic.get("gen") == end_topic["gen"]
        latest_topic = latest.get(topic) or {}
        topic_counts = (counted or {}).get(topic) or {}
        partitions, total, end_pos, latest_pos = [], 0, 0, 0
        latest_known = latest_topic.get("gen") == end_topic["gen"]
        admitted = end_topic.get("admitted") or {}
        for p, part in sorted(end_topic["parts"].items()):
            begin = start_topic.get("parts", {}).get(p, {}).get("n", 0) if same_gen else 0
            entries = part["n"] - begin
            rows = topic_counts.get(str(int(p)), 0 if entries == 0 else None)
            partitions.append({"partition": int(p), "rows": rows})
            total = None if total is None or rows is None else total + rows
            end_pos += part["n"]
            latest_n = latest_topic.get("parts", {}).get(p, {}).get("n") if latest_known else None
            latest_pos += latest_n if latest_n is not None else part["n"]
        result.append({
            "topic": topic, "generation": end_topic["gen"], "rows": total, "end_position": end_pos,
            "latest_position": latest_pos if latest_known else None,
            "backlog": max(0, latest_pos - end_pos) if latest_known else None,
            "replaying": bool(end_topic.get("target")) and not replay_finished(end_topic),
            "admitted_messages": _count(admitted.get("messages")), "admitted_bytes": _count(admitted.get("bytes")),
            "partitions": partitions,
        })
    return result


def orders_admission(end: dict) -> dict:
    """Whether the batch held the orders back for the changelogs, from its end offset.

    The planner admits the topics read after the changelogs (the orders) only once every changelog
    partition is admitted up to its newest entry; their offsets carry ``held_for`` (batches in a row,
    this one included, that the changelogs alone filled the cap; absent = 0) and ``shared`` (the
    orders got a share anyway, as ``held_for`` passed ``job.orders_share_after``; absent = false).
    ``{"orders_held": True, "orders_shared": False, "orders_held_for": 3}``
    """
    changelogs = {lookup.changelog for lookup in LOOKUPS}
    after = [topic for name, topic in end.items() if name not in changelogs]
    held_for = max((_count(topic.get("held_for")) or 0 for topic in after), default=0)
    shared = held_for > 0 and any(topic.get("shared") is True for topic in after)
    return {"orders_held": held_for > 0 and not shared, "orders_shared": shared, "orders_held_for": held_for}


def _count(value) -> int | None:
    """A non-negative integer the offsets state, or None when they do not (or state nonsense)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def build_progress_row(progress: dict, trigger_interval_ms: int, sink_rows: dict | None,
                       state_size_bytes: int | None) -> dict:
    """Our ``progress`` row from Spark's StreamingQueryProgress JSON (see the module docstring)."""
    ts = int(datetime.strptime(progress["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp() * 1000)
    source = (progress.get("sources") or [{}])[0]
    end = source_offset(source.get("endOffset"))
    topics = topic_rows(source_offset(source.get("startOffset")), end, source_offset(source.get("latestOffset")),
                        rows_from_progress(progress))
    # Spark lists state operators from the top of the plan down (a pre-order walk), so the
    # last stage comes first: the item lookup, then the user lookup (operator ids 0 and 1).
    operators = list(reversed(progress.get("stateOperators") or []))
    state = []
    for name, op in zip(STATEFUL_STAGES, operators):
        # Per-partition snapshot markers grow with the partition count and say little to an operator.
        custom = {k: v for k, v in (op.get("customMetrics") or {}).items() if not k.startswith("SnapshotLastUploaded")}
        state.append({"operator": name, "rows_total": op.get("numRowsTotal", 0), "rows_updated": op.get("numRowsUpdated", 0),
                      "memory_bytes": op.get("memoryUsedBytes", 0), "commit_ms": op.get("commitTimeMs", 0),
                      "custom": custom})
    return {
        "ts": progress["timestamp"], "ts_ms": ts, "query_id": progress.get("id"), "run_id": progress.get("runId"),
        "batch_id": progress["batchId"], "num_input_rows": progress.get("numInputRows", 0),
        "input_rows_per_second": finite_or_zero(progress.get("inputRowsPerSecond")),
        "processed_rows_per_second": finite_or_zero(progress.get("processedRowsPerSecond")),
        "trigger_interval_ms": trigger_interval_ms, "batch_duration_ms": progress.get("batchDuration", 0),
        "duration_ms": progress.get("durationMs") or {}, "topics": topics, **orders_admission(end), "state": state,
        "sink_rows": sink_rows or dict.fromkeys(store.SINKS, 0),
        "state_size_bytes": state_size_bytes,
    }


def finite_or_zero(value) -> float:
    """A progress event's rate as a float: 0.0 for none, text that is no number, NaN or infinity."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if number == number and abs(number) != float("inf") else 0.0


def task_rows_from_stages(batch_id: int, stages: list[dict], ts_ms: int) -> list[dict]:
    """``tasks`` rows for the stateful stages of one batch.

    ``stages`` are Spark REST stage details (with ``tasks``) of the batch's jobs; the stages
    that read a shuffle are the lookups, in plan order: user_lookup, then item_lookup.
    """
    reading = sorted((s for s in stages if s.get("shuffleReadRecords", 0) > 0 or _reads_shuffle(s)),
                     key=lambda s: s["stageId"])
    rows = []
    for name, stage in zip(STATEFUL_STAGES, reading):
        for task in (stage.get("tasks") or {}).values():
            metrics = task.get("taskMetrics") or {}
            rows.append({"ts_ms": ts_ms, "batch_id": batch_id, "stage": name, "stage_id": stage["stageId"],
                         "task": task.get("index", 0),
                         "records": (metrics.get("shuffleReadMetrics") or {}).get("recordsRead", 0),
                         "duration_ms": task.get("duration", metrics.get("executorRunTime", 0))})
    return rows


def _reads_shuffle(stage: dict) -> bool:
    return any(((t.get("taskMetrics") or {}).get("shuffleReadMetrics") or {}).get("recordsRead", 0) > 0
               for t in (stage.get("tasks") or {}).values())


def directory_size(path: Path) -> int:
    total = 0
    for child in Path(path).rglob("*"):
        try:
            if child.is_file():
                total += child.stat().st_size
        except OSError:
            continue
    return total
