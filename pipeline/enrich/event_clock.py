"""Event time on the driver: each changelog partition's watermark, and which partitions are idle.

In event time (README "Event time") Spark keeps the job's watermark; what it does not keep is
the watermark of each changelog partition, nor when a partition has gone quiet.
:class:`EventClockListener` follows both from the query's progress, batch by batch (called on
the driver, from Spark's listener bus, once per batch). Partitions are named by
``source.clock.partition_name`` (``users`` for a topic that is not partitioned, ``users/0`` for a
partition):

- the newest event time read from each partition, from the batch's observed metrics
  (``lookups.with_event_watermarks`` observes them), so a partition's watermark is its running
  newest minus ``enrichment.out_of_orderness``, and a topic's the least of its partitions' (the
  idle ones left out); each batch gives one ``watermarks`` row in the metrics store, per topic
  with its partitions and the late versions the lookups counted (the Backpressure page shows it);
- a changelog partition is **idle** once its read position has not moved for
  ``enrichment.idle_timeout`` while nothing waits on it (backlog 0): it stops holding the
  watermark back (the book's "Idle Sources"). Going idle and becoming active again are events
  in the metrics store (``topic_idle`` / ``topic_active``, naming the partition). Idleness is
  processing time by nature: where it lets the watermark pass, results can depend on timing,
  as in Flink;
- after each batch, and when a partition goes idle, the listener writes the **clock file**
  (pipeline/source/clock.py): each changelog partition's newest time, the idle ones, and the
  batch taken in. The source carries it in the next batch's offset and bounds each row's part
  in the watermark with it; when the clock moves with no new message (a partition went idle in
  a quiet stream), the source still plans a batch, with one clock row: time moves without
  input, and the orders it makes due are decided within about ``idle_timeout`` plus two
  triggers;
- the newest event time per partition as of each committed batch, kept in the checkpoint
  (:func:`restored_newest`): Spark restores only the job's watermark after a restart, and the
  query is rebuilt with these so a quiet partition does not hold it back anew.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime, timezone
from pathlib import Path

from pipeline import metrics, store
# observed per batch: event_time_users/0 -> {"newest_ms": …}, late_versions_users -> {"count": …}
from pipeline.enrich.lookups import CHANGELOGS, LATE_VERSIONS_PREFIX, NEWEST_OBSERVED, topic_of_clock
from pipeline.listener import ProgressListener
from pipeline.source.clock import partition_name, write_clock_file

log = logging.getLogger(__name__)


def clock_file(data_dir: Path) -> Path:
    """Where the driver keeps the event-time clock for the source (pipeline/source/clock.py)."""
    return store.checkpoint_dir(data_dir).parent / "event-time" / "clock.json"


NEWEST_FILE = "event-time-newest.json"  # in the checkpoint, so savepoints and restores carry it
NEWEST_KEPT = 50


def restored_newest(checkpoint: Path) -> dict[str, int]:
    """The newest event time per changelog partition (clock name) and of the orders, as of the
    checkpoint's last committed batch ({} if unknown).

    Spark's offset log keeps only the job's watermark, not each partition's, so after a restart a
    quiet partition would hold the watermark back until it had new messages; the query is built
    with these instead (``lookups.with_event_watermarks``)."""
    from pipeline.sinks import last_committed_batch

    try:
        entries = json.loads((Path(checkpoint) / NEWEST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    last = last_committed_batch(Path(checkpoint))
    usable = [entry for entry in entries if isinstance(entry, dict) and entry.get("batch_id", last + 1) <= last]
    return {str(k): int(v) for k, v in max(usable, key=lambda e: e["batch_id"])["newest"].items()} if usable else {}


def keep_newest(checkpoint: Path, history: list[dict], batch_id: int, newest: dict[str, int]) -> list[dict]:
    """``history`` with the newest times as of ``batch_id`` (a committed batch), written to the
    checkpoint for :func:`restored_newest` (the last ``NEWEST_KEPT`` batches: a restart may go
    back to an older one); returns it. Nothing is written before the checkpoint exists."""
    if not newest or not Path(checkpoint).is_dir():
        return history
    history = [entry for entry in history if entry["batch_id"] < batch_id][-(NEWEST_KEPT - 1):]
    history.append({"batch_id": batch_id, "newest": dict(newest)})
    store.replace_file(Path(checkpoint) / NEWEST_FILE, json.dumps(history))
    return history


def changelog_partitions(service_url: str, topics: dict[str, str], token: str | None = None) -> dict[str, list[int]]:
    """The partitions of each changelog topic, as ``with_event_watermarks`` takes them (-1 for a
    topic that is not partitioned), asked with ``pulsar.auth_token`` when there is one. Called
    on the driver when the query is built."""
    from pipeline.source.counts import list_topic_partitions

    # the driver's client for this URL is shared with the source: it carries the token
    return watermark_partitions(list_topic_partitions(service_url, {kind: topics[kind] for kind in CHANGELOGS}, token))


def watermark_partitions(listed: dict[str, list[str]]) -> dict[str, list[int]]:
    """The changelogs' partitions as ``with_event_watermarks`` takes them, from a listing of
    every topic's (``counts.list_topic_partitions``)."""
    return {kind: [int(part) for part in listed[kind]] for kind in CHANGELOGS}


def newest_from_progress(progress: dict) -> dict[str, int]:
    """The newest event time per changelog partition (and ``orders``) that this batch read
    (those with none are left out)."""
    values = (progress.get("observedMetrics") or {}).get(NEWEST_OBSERVED)
    if not isinstance(values, dict):
        return {}
    return {str(name): int(ms) for name, ms in values.items() if ms is not None}


def late_versions_from_progress(progress: dict) -> dict[str, int]:
    """Per changelog, the late versions the lookups counted in this batch (0 when none)."""
    counts = {}
    for name, values in (progress.get("observedMetrics") or {}).items():
        if name.startswith(LATE_VERSIONS_PREFIX) and isinstance(values, dict):
            counts[name[len(LATE_VERSIONS_PREFIX):]] = int(values.get("count") or 0)
    return counts


def partition_positions(end: dict, latest: dict) -> dict[str, tuple[object, int, int | None]]:
    """Per partition of each topic (clock name): (generation, read position, messages not read
    yet or None when unknown), from the source's end and latest offsets."""
    positions = {}
    for topic, end_topic in end.items():
        latest_topic = latest.get(topic) or {}
        same_gen = latest_topic.get("gen") == end_topic.get("gen")
        for part, values in (end_topic.get("parts") or {}).items():
            latest_n = ((latest_topic.get("parts") or {}).get(part) or {}).get("n") if same_gen else None
            positions[partition_name(topic, int(part))] = (end_topic.get("gen"), values["n"],
                                                       None if latest_n is None else max(0, latest_n - values["n"]))
    return positions


def idle_topics(last_moved_ms: dict[str, int], backlog: dict[str, int | None], now_ms: int, timeout_ms: int) -> set[str]:
    """Changelog partitions (clock names) whose position has not moved for ``timeout_ms`` and that
    have nothing unread (0 turns idleness off)."""
    if timeout_ms <= 0:
        return set()
    return {name for name, moved in last_moved_ms.items()
            if now_ms - moved >= timeout_ms and not (backlog.get(name) or 0)}


def topic_watermark(partitions: list[dict]) -> int | None:
    """A topic's watermark from its partitions' (``watermark_ms``, ``idle``): the least of those
    that hold it back (not idle; all of them when every one is idle). None while one of them has
    read nothing yet (it holds the job's watermark at 0)."""
    holding = [part for part in partitions if not part["idle"]] or partitions
    marks = [part["watermark_ms"] for part in holding]
    return None if not marks or None in marks else min(marks)


def describe_clock(name: str) -> str:
    """``users/0`` -> ``users partition 0``; ``users`` stays ``users``."""
    topic, _, partition = name.partition("/")
    return f"{topic} partition {partition}" if partition else topic


class EventClockListener(ProgressListener):
    """Per-partition watermarks and idle changelog partitions from the progress of the event-time query."""

    def __init__(self, metrics_store: metrics.MetricsStore, data_dir: Path, out_of_orderness_ms: int, idle_timeout_ms: int,
                 partitions: dict[str, list[int]] | None = None):
        """``partitions``: the changelogs' partitions the query observes (as ``watermark_partitions``
        gives them); each holds the watermark at 0 until it has a time, idle or not."""
        self.store, self.out_of_orderness_ms, self.idle_timeout_ms = metrics_store, out_of_orderness_ms, idle_timeout_ms
        self.followed = {partition_name(kind, p) for kind, parts in (partitions or {}).items() for p in parts}
        self.path = clock_file(data_dir)
        self.through: dict | None = None  # the end offset of the last batch taken in (None: none yet)
        self.checkpoint = store.checkpoint_dir(data_dir)
        self.newest: dict[str, int] = restored_newest(self.checkpoint)
        self.history: list[dict] = []
        self.positions: dict[str, tuple] = {}
        self.last_moved_ms: dict[str, int] = {}
        self.backlog: dict[str, int | None] = {}
        self.idle: set[str] = set()
        self.write_clock()  # a restarted job starts with every changelog partition active

    def onQueryProgress(self, event) -> None:
        try:
            self.observe(json.loads(event.progress.json))
        except Exception:  # a listener error must never take the job down; it is logged
            log.exception("event-time listener failed on a progress event")

    def onQueryIdle(self, event) -> None:
        """A trigger with no new data (Spark posts no progress for it): time still passes, so a
        changelog partition can go idle now, and the next batch (new orders) must see it."""
        try:
            try:
                now_ms = _iso_ms(event.timestamp)
            except (TypeError, ValueError):
                now_ms = int(time.time() * 1000)
            self.update_idle(now_ms)
        except Exception:  # a listener error must never take the job down; it is logged
            log.exception("event-time listener failed on an idle event")

    def update_idle(self, now_ms: int) -> None:
        """Mark the changelog partitions idle at ``now_ms`` (events and the idle file on a change)."""
        changelog_moves = {n: m for n, m in self.last_moved_ms.items() if topic_of_clock(n) in CHANGELOGS}
        idle = idle_topics(changelog_moves, self.backlog, now_ms, self.idle_timeout_ms)
        for name in sorted(idle - self.idle):
            self.store.event("topic_idle", f"{describe_clock(name)} has had no new message for "
                             f"{self.idle_timeout_ms / 1000:g}s: it no longer holds the event-time watermark back",
                             **_clock_details(name))
        for name in sorted(self.idle - idle):
            self.store.event("topic_active", f"{describe_clock(name)} has new messages: it holds the event-time "
                             "watermark again", **_clock_details(name))
        changed, self.idle = idle != self.idle, idle
        if changed:
            self.write_clock()

    def observe(self, progress: dict) -> dict:
        """Take one batch's progress; returns (and stores) its ``watermarks`` row."""
        ts_ms = _iso_ms(progress["timestamp"])
        for name, newest in newest_from_progress(progress).items():
            self.newest[name] = max(self.newest.get(name, newest), newest)
        self.keep_newest(progress["batchId"])
        source = (progress.get("sources") or [{}])[0]
        self.through = metrics.source_offset(source.get("endOffset")) or None
        backlog = {}
        for name, (generation, position, unread) in partition_positions(
                metrics.source_offset(source.get("endOffset")), metrics.source_offset(source.get("latestOffset"))).items():
            if self.positions.get(name) != (generation, position):
                self.positions[name] = (generation, position)
                self.last_moved_ms[name] = ts_ms
            backlog[name] = unread
        self.backlog = backlog
        self.update_idle(ts_ms)
        self.write_clock()  # the next batch waits for it (clock.wait_for_clock)
        watermark = (progress.get("eventTime") or {}).get("watermark")
        row = {"ts": progress["timestamp"], "ts_ms": ts_ms, "batch_id": progress["batchId"],
               "watermark_ms": _iso_ms(watermark) if watermark else None,
               "topics": self.topic_entries(late_versions_from_progress(progress))}
        self.store.append("watermarks", row)
        return row

    def topic_entries(self, late_versions: dict[str, int]) -> list[dict]:
        """Per topic: its newest time, its watermark (the least of its partitions'), how far that
        lags behind the newest event time read anywhere, idleness, this batch's late versions, and
        its partitions when it has several."""
        newest_any = max(self.newest.values(), default=None)
        by_topic: dict[str, list[str]] = {}
        for name in sorted(self.positions, key=lambda n: (topic_of_clock(n), int(n.partition("/")[2] or -1))):
            by_topic.setdefault(topic_of_clock(name), []).append(name)
        entries = []
        for topic, names in sorted(by_topic.items()):
            parts = [{"partition": int(name.partition("/")[2] or -1), "newest_ms": self.newest.get(name),
                      "watermark_ms": self.newest[name] - self.out_of_orderness_ms if name in self.newest else None,
                      "idle": name in self.idle} for name in names]
            if topic not in CHANGELOGS:  # orders hold no watermark: only their newest time is shown
                parts = [{"partition": -1, "newest_ms": self.newest.get(topic),
                          "watermark_ms": self.newest[topic] - self.out_of_orderness_ms if topic in self.newest else None,
                          "idle": False}]
            mark = topic_watermark(parts)
            newest = [part["newest_ms"] for part in parts if part["newest_ms"] is not None]
            entries.append({"topic": topic, "newest_ms": max(newest) if newest else None, "watermark_ms": mark,
                            "lag_ms": None if mark is None or newest_any is None else newest_any - mark,
                            "idle": all(part["idle"] for part in parts),
                            "late_versions": late_versions.get(topic, 0) if topic in CHANGELOGS else None,
                            "partitions": parts if len(parts) > 1 else []})
        return entries

    def keep_newest(self, batch_id: int) -> None:
        """Record the newest times as of this (committed) batch in the checkpoint."""
        self.history = keep_newest(self.checkpoint, self.history, batch_id, self.newest)

    def write_clock(self) -> None:
        """The changelog partitions' newest times, the idle ones, and the batch taken in."""
        names = self.followed | {name for name in self.newest if topic_of_clock(name) in CHANGELOGS}
        write_clock_file(self.path, {name: self.newest.get(name) for name in sorted(names)}, self.idle, self.through)


def _clock_details(name: str) -> dict:
    topic, _, partition = name.partition("/")
    return {"topic": topic, "partition": int(partition) if partition else None}


def _iso_ms(text: str) -> int:
    return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp() * 1000)
