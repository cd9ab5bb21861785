"""Event time on the driver: each changelog's watermark, and which changelogs are idle.

In event time (README "Event time") Spark keeps the job's watermark; what it does not keep is
the watermark of each topic, nor when a topic has gone quiet. :class:`EventClockListener`
follows both from the query's progress, batch by batch (called on the driver, from Spark's
listener bus, once per batch):

- the newest event time read from each topic, from the batch's observed metrics
  (``lookups.with_event_watermarks`` observes them), so a topic's watermark is its running
  newest minus ``enrichment.out_of_orderness``; each batch gives one ``watermarks`` row in the
  metrics store (the Backpressure page shows it);
- a changelog topic is **idle** once its read position has not moved for
  ``enrichment.idle_timeout`` while nothing waits on it (backlog 0). The listener writes the
  idle topics to a small file that the parse step reads on the executors, and from then on every
  row of the batch counts for that topic's watermark: it stops holding the watermark back (the
  book's "Idle Sources"). Going idle and becoming active again are events in the metrics store.
  Idleness is processing time by nature: where it lets the watermark pass, results can depend on
  timing, as in Flink;
- the newest event time per topic as of each committed batch, kept in the checkpoint
  (:func:`restored_newest`): Spark restores only the job's watermark after a restart, and the
  query is rebuilt with these so a quiet changelog does not hold it back anew.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path

from pipeline import metrics, store
from pipeline.enrich.lookups import OBSERVED_PREFIX  # observed per topic: event_time_users -> {"newest_ms": …}
from pipeline.listener import ProgressListener

log = logging.getLogger(__name__)
CHANGELOGS = ("users", "items")


def idle_file(data_dir: Path) -> Path:
    """Where the driver says which changelogs are idle (read by the parse step)."""
    return store.checkpoint_dir(data_dir).parent / "event-time" / "idle.json"


NEWEST_FILE = "event-time-newest.json"  # in the checkpoint, so savepoints and restores carry it
NEWEST_KEPT = 50


def restored_newest(checkpoint: Path) -> dict[str, int]:
    """The newest event time per topic as of the checkpoint's last committed batch ({} if unknown).

    Spark's offset log keeps only the job's watermark, not each changelog's, so after a restart a
    quiet changelog would hold the watermark back until it had new messages; the query is built
    with these instead (``lookups.with_event_watermarks``)."""
    from pipeline.sinks import last_committed_batch

    try:
        entries = json.loads((Path(checkpoint) / NEWEST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    last = last_committed_batch(Path(checkpoint))
    usable = [entry for entry in entries if isinstance(entry, dict) and entry.get("batch_id", last + 1) <= last]
    return {str(k): int(v) for k, v in max(usable, key=lambda e: e["batch_id"])["newest"].items()} if usable else {}


def newest_from_progress(progress: dict) -> dict[str, int]:
    """The newest event time per topic that this batch read (topics with none are left out)."""
    newest = {}
    for name, values in (progress.get("observedMetrics") or {}).items():
        if name.startswith(OBSERVED_PREFIX) and isinstance(values, dict) and values.get("newest_ms") is not None:
            newest[name[len(OBSERVED_PREFIX):]] = int(values["newest_ms"])
    return newest


def idle_topics(last_moved_ms: dict[str, int], backlog: dict[str, int | None], now_ms: int, timeout_ms: int) -> set[str]:
    """Changelogs whose position has not moved for ``timeout_ms`` and that have nothing unread
    (0 turns idleness off)."""
    if timeout_ms <= 0:
        return set()
    return {topic for topic, moved in last_moved_ms.items()
            if now_ms - moved >= timeout_ms and not (backlog.get(topic) or 0)}


class EventClockListener(ProgressListener):
    """Per-topic watermarks and idle changelogs from the progress of the event-time query."""

    def __init__(self, metrics_store: metrics.MetricsStore, data_dir: Path, out_of_orderness_ms: int, idle_timeout_ms: int):
        self.store, self.out_of_orderness_ms, self.idle_timeout_ms = metrics_store, out_of_orderness_ms, idle_timeout_ms
        self.path = idle_file(data_dir)
        self.checkpoint = store.checkpoint_dir(data_dir)
        self.newest: dict[str, int] = restored_newest(self.checkpoint)
        self.history: list[dict] = []
        self.positions: dict[str, int] = {}
        self.last_moved_ms: dict[str, int] = {}
        self.idle: set[str] = set()
        self.write_idle(set())  # a restarted job starts with every changelog active

    def onQueryProgress(self, event) -> None:
        try:
            self.observe(json.loads(event.progress.json))
        except Exception:  # a listener error must never take the job down; it is logged
            log.exception("event-time listener failed on a progress event")

    def observe(self, progress: dict) -> dict:
        """Take one batch's progress; returns (and stores) its ``watermarks`` row."""
        ts_ms = int(datetime.strptime(progress["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
                    .replace(tzinfo=timezone.utc).timestamp() * 1000)
        for topic, newest in newest_from_progress(progress).items():
            self.newest[topic] = max(self.newest.get(topic, newest), newest)
        self.keep_newest(progress["batchId"])
        source = (progress.get("sources") or [{}])[0]
        rows = metrics.topic_rows(metrics._offset(source.get("startOffset")), metrics._offset(source.get("endOffset")),
                                  metrics._offset(source.get("latestOffset")))
        backlog = {}
        for row in rows:
            position = (row["generation"], row["end_position"])
            if self.positions.get(row["topic"]) != position:
                self.positions[row["topic"]] = position
                self.last_moved_ms[row["topic"]] = ts_ms
            backlog[row["topic"]] = row["backlog"]
        idle = idle_topics({t: m for t, m in self.last_moved_ms.items() if t in CHANGELOGS}, backlog, ts_ms,
                           self.idle_timeout_ms)
        for topic in sorted(idle - self.idle):
            self.store.event("topic_idle", f"{topic} has had no new message for {self.idle_timeout_ms / 1000:g}s: "
                             "it no longer holds the event-time watermark back", topic=topic)
        for topic in sorted(self.idle - idle):
            self.store.event("topic_active", f"{topic} has new messages: it holds the event-time watermark again",
                             topic=topic)
        if idle != self.idle:
            self.write_idle(idle)
        self.idle = idle
        watermark = (progress.get("eventTime") or {}).get("watermark")
        newest_any = max(self.newest.values(), default=None)
        topics = []
        for topic in sorted(self.positions):
            topic_watermark = self.newest[topic] - self.out_of_orderness_ms if topic in self.newest else None
            topics.append({"topic": topic, "newest_ms": self.newest.get(topic), "watermark_ms": topic_watermark,
                           # how far this topic's watermark is behind the newest event time read anywhere
                           "lag_ms": None if topic_watermark is None else newest_any - topic_watermark,
                           "idle": topic in idle})
        row = {"ts": progress["timestamp"], "ts_ms": ts_ms, "batch_id": progress["batchId"],
               "watermark_ms": _iso_ms(watermark) if watermark else None, "topics": topics}
        self.store.append("watermarks", row)
        return row

    def keep_newest(self, batch_id: int) -> None:
        """Record the newest times as of this (committed) batch in the checkpoint."""
        if not self.newest or not self.checkpoint.is_dir():
            return
        self.history = [entry for entry in self.history if entry["batch_id"] < batch_id][-(NEWEST_KEPT - 1):]
        self.history.append({"batch_id": batch_id, "newest": dict(self.newest)})
        target = self.checkpoint / NEWEST_FILE
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.history))
        os.replace(tmp, target)

    def write_idle(self, idle: set[str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"idle": sorted(idle)}))
        os.replace(tmp, self.path)


def _iso_ms(text: str) -> int:
    return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp() * 1000)
