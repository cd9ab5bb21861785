"""The query listener: records progress, tasks, replays and order shares.

Spark calls ``onQueryProgress`` on the driver after a batch is in the commit log (the sinks
committed it already, inside foreachBatch: pipeline/sinks.py). Order shares: when the changelogs alone have filled the
batch cap for long enough that the orders get a share anyway, that is an event
(``orders_share_started``), and so is its end (``orders_share_ended``, with the orders admitted
meanwhile); :func:`decide_order_share` decides both from the progress rows. Task metrics come from Spark's REST API (the UI binds
127.0.0.1) on a background thread, so the listener bus never waits on HTTP.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener

from pipeline import metrics, store
from pipeline.enrich.lookups import LOOKUPS
from pipeline.metrics import MetricsStore
from pipeline.metrics_tail import parse_lines, tail_lines
from pipeline.sinks import SinkWriter

log = logging.getLogger(__name__)

# How long to keep asking Spark's UI for a finished batch's stages before recording what it has.
TASKS_WAIT_S = 10.0


class ProgressAsJson(JStreamingQueryListener):
    """The Java-facing side of a :class:`ProgressListener`: PySpark's, except that a progress event
    reaches the listener as its JSON text and query name (``event.progress.json``,
    ``event.progress.name``, all our listeners read). PySpark's own copies every field of the
    progress into Python objects, one py4j call at a time: about 100 ms a batch for each
    listener (measured on two cores: 96 ms median, 240 ms at worst, against 1.2 ms for the
    JSON), on the driver, on Spark's listener bus, which the next event-time batch waits on."""

    def onQueryProgress(self, jevent) -> None:
        jprogress = jevent.progress()
        self.pylistener.onQueryProgress(SimpleNamespace(progress=SimpleNamespace(json=jprogress.json(),
                                                                                 name=jprogress.name())))


class ProgressListener(StreamingQueryListener):
    """A listener that only acts on progress: Spark requires the other callbacks, which do nothing."""

    @property
    def _jlistener(self):
        # what PySpark's addListener / removeListener register (pyspark 4.3's StreamingQueryListener,
        # pinned), with the progress as JSON (ProgressAsJson)
        from pyspark import SparkContext

        if not hasattr(self, "_jlistenerobj"):
            wrapper = SparkContext._jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper
            self._jlistenerobj = wrapper(ProgressAsJson(self))
        return self._jlistenerobj

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass


class JobListener(ProgressListener):
    """One per job process; ``on_batch`` lets the job count batches (for ``--max-batches``)."""

    def __init__(self, store: MetricsStore, writer: SinkWriter, checkpoint: Path, trigger_interval_ms: int,
                 ui_url: str | None, app_id: str, on_batch=None):
        self.store, self.writer, self.checkpoint = store, writer, Path(checkpoint)
        self.trigger_interval_ms = trigger_interval_ms
        self.on_batch = on_batch
        self.replays = _replay_state(store.data_dir)
        self.share, missed = recover_order_share(store.data_dir)
        for kind, message, details in missed:
            store.event(kind, message, **details)
        self._tasks: queue.Queue = queue.Queue(maxsize=100)
        if ui_url:
            threading.Thread(target=self._fetch_tasks_forever, args=(ui_url.rstrip("/"), app_id),
                             name="task-metrics", daemon=True).start()

    def onQueryIdle(self, event) -> None:
        """The job runs and has nothing to read (no batch runs then): its heartbeat, so the
        console tells an idle job from a stopped one."""
        try:
            write_heartbeat(self.store.data_dir, int(time.time() * 1000))
        except Exception:  # a listener error must never take the job down; it is logged
            log.exception("query listener failed on an idle event")

    def onQueryProgress(self, event) -> None:
        try:
            progress = json.loads(event.progress.json)
            batch_id = progress["batchId"]
            row = metrics.build_progress_row(progress, self.trigger_interval_ms, self.writer.last_counts.get(batch_id),
                                             metrics.directory_size(self.checkpoint / "state"))
            self.store.append("progress", row)
            self._record_replays(row)
            self._record_order_share(row)
            try:
                self._tasks.put_nowait((progress.get("runId", ""), batch_id, row["ts_ms"]))
            except queue.Full:
                pass
            if self.on_batch:
                self.on_batch(batch_id)
        except Exception:  # a listener error must never take the job down; it is logged
            log.exception("query listener failed on a progress event")

    def _record_replays(self, row: dict) -> None:
        for topic in row["topics"]:
            seq = topic["generation"]
            if not seq:
                continue
            state = self.replays.setdefault(seq, {})
            if "finished" not in state:  # a running total: each progress row is counted once, here
                state["messages"] = state["messages"] + (topic.get("rows") or 0) if "messages" in state else \
                    recount_replayed(self.store.data_dir, topic["topic"], seq, state.get("started"))
            if "started" not in state:
                state["started"] = row["ts_ms"]
                request = _replay_request(self.store.data_dir, seq)
                self.store.event("replay_started", f"replay #{seq} of {topic['topic']} started from "
                                 f"{request.get('from', 'earliest')}", seq=seq, topic=topic["topic"],
                                 target_position=topic["latest_position"], **{"from": request.get("from", "earliest")})
            if not topic["replaying"] and "finished" not in state:
                state["finished"] = row["ts_ms"]
                messages = state["messages"]
                self.store.event("replay_finished", f"replay #{seq} of {topic['topic']} re-applied "
                                 f"{messages} messages", seq=seq, topic=topic["topic"],
                                 messages=messages, duration_ms=row["ts_ms"] - state["started"])

    def _record_order_share(self, row: dict) -> None:
        self.share, event = decide_order_share(self.share, row)
        if event:
            self.store.event(event[0], event[1], **event[2])

    def _fetch_tasks_forever(self, ui_url: str, app_id: str) -> None:
        base = f"{ui_url}/api/v1/applications/{app_id}"
        while True:
            run_id, batch_id, ts_ms = self._tasks.get()
            # The UI's status store trails the batch (it is fed by Spark's own listener bus), so
            # right after a batch its stages may still show as running: ask again for a while.
            deadline = time.monotonic() + TASKS_WAIT_S
            while True:
                try:
                    stages, settled = batch_stages(lambda path: _get_json(base + path), run_id, batch_id)
                except Exception as exc:  # the UI may be off or busy; task rows are best effort per batch
                    log.info("no task metrics for batch %s: %s", batch_id, exc)
                    break
                if settled or time.monotonic() > deadline:
                    for row in metrics.task_rows_from_stages(batch_id, stages, ts_ms):
                        self.store.append("tasks", row)
                    break
                time.sleep(0.25)


def batch_stages(get_json, run_id: str, batch_id: int) -> tuple[list[dict], bool]:
    """The completed stages of one batch's jobs, and whether every one of its stages is done.

    A job belongs to the batch when its description names this query run and the batch: batch ids
    repeat across queries and runs in one SparkSession. A stage the UI no longer holds (it keeps
    fewer stages than jobs: ``UI_RETENTION_CONF``) is skipped, not an error for the whole batch.
    """
    wanted = {f"runId = {run_id}", f"batch = {batch_id}"}
    jobs = [job for job in get_json("/jobs") if wanted <= set((job.get("description") or "").split("\n"))]
    stages, settled = [], bool(jobs) and all(job.get("status") != "RUNNING" for job in jobs)
    for stage_id in sorted({s for job in jobs for s in job.get("stageIds", [])}):
        try:
            attempts = get_json(f"/stages/{stage_id}?details=true")
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            continue
        done = [a for a in attempts if a.get("status") == "COMPLETE"]
        stages.extend(done)
        # A stage Spark skipped (its shuffle output was reused) never completes; only an active one counts.
        settled = settled and (done or all(a.get("status") in ("SKIPPED", "FAILED") for a in attempts))
    return stages, settled


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _replay_request(data_dir: Path, seq: int) -> dict:
    try:
        return json.loads((store.replay_requests_dir(data_dir) / f"{seq:08d}.json").read_text())
    except (OSError, ValueError):
        return {}


def replayed_messages(rows: list[dict], topic: str, seq: int) -> int:
    """The messages a replay re-read in these progress rows: its generation's rows (the source's
    offsets count entries; the rows are messages counted where they were read)."""
    return sum(entry.get("rows") or 0 for row in rows
               for entry in row.get("topics") or [] if entry.get("topic") == topic and entry.get("generation") == seq)


def recount_replayed(data_dir: Path, topic: str, seq: int, started_ms: int | None) -> int:
    """A replay's messages so far, counted once when this process first sees it (then kept as a
    running total). Started in an earlier process: the progress rows since the day before its
    start event. New: its rows among the newest few, which hold all of them (the start event
    follows the replay's first row; only a crash in between leaves an earlier one)."""
    if started_ms is not None:
        return replayed_messages(metrics.read_rows(data_dir, "progress", since_ms=started_ms - 86_400_000), topic, seq)
    lines, _ = tail_lines(data_dir, "progress", 16)
    return replayed_messages(parse_lines(lines), topic, seq)


def _replay_state(data_dir: Path) -> dict[int, dict]:
    """Which replays were already reported started/finished (so restarts do not repeat events)."""
    state: dict[int, dict] = {}
    for row in metrics.read_events(data_dir, ("replay_started", "replay_finished")):
        seq = row.get("details", {}).get("seq")
        if seq is not None:
            state.setdefault(seq, {})["started" if row["kind"] == "replay_started" else "finished"] = row["ts_ms"]
    return state


# ---------------------------------------------------------------------------- order shares


@dataclass(frozen=True)
class OrderShare:
    """A run of batches in which the orders got a share while the changelogs filled the cap."""

    started_batch: int
    last_batch: int  # the newest shared batch
    held_for: int  # batches in a row the changelogs had filled the cap, as of the newest shared batch
    batches: int  # shared batches so far
    orders: int | None  # orders admitted in them (exact, counted where read); None if one was not counted


def decide_order_share(share: OrderShare | None, row: dict) -> tuple[OrderShare | None, tuple[str, str, dict] | None]:
    """The share run after one progress row, and the event to record, if any: ``(kind, message, details)``.

    Pure; called once per batch in batch order. A run starts with the first batch whose orders got
    a share anyway (``orders_shared``) and ends with the next batch that did not share: the
    changelogs no longer fill the cap, or the orders are held back again. The orders admitted are
    the exact ``rows`` of the topics read after the changelogs in the shared batches.
    """
    orders = _orders_rows(row)
    if row.get("orders_shared"):
        held_for = int(row.get("orders_held_for") or 0)
        if share is None:
            return OrderShare(row["batch_id"], row["batch_id"], held_for, 1, orders), (
                "orders_share_started",
                f"the changelogs filled the batch cap for {held_for} batches in a row: orders now get a share anyway "
                f"(from batch {row['batch_id']})", {"batch_id": row["batch_id"], "held_for": held_for})
        total = None if share.orders is None or orders is None else share.orders + orders
        return replace(share, last_batch=row["batch_id"], held_for=held_for, batches=share.batches + 1, orders=total), None
    if share is None:
        return None, None
    why = "orders are held back for the changelogs again" if row.get("orders_held") else "the changelogs no longer fill the batch cap"
    counted = "an uncounted number of" if share.orders is None else f"{share.orders:,}"
    return None, ("orders_share_ended",
                  f"{why}: {counted} orders were admitted while they filled it (batches {share.started_batch}-"
                  f"{share.last_batch}, {share.held_for} in a row at most)",
                  {"started_batch": share.started_batch, "last_batch": share.last_batch, "batch_id": row["batch_id"],
                   "batches": share.batches,
                   "held_for": share.held_for, "orders": share.orders, "orders_held": bool(row.get("orders_held"))})


def _orders_rows(row: dict) -> int | None:
    """The messages read this batch from the topics read after the changelogs (the orders)."""
    changelogs = {lookup.changelog for lookup in LOOKUPS}
    rows = [topic.get("rows") for topic in row.get("topics") or [] if topic.get("topic") not in changelogs]
    return None if any(value is None for value in rows) else sum(rows)


def recover_order_share(data_dir: Path) -> tuple[OrderShare | None, list[tuple[str, str, dict]]]:
    """The share run a previous process left open (its start event has no end event), rebuilt
    from the progress rows since it started, and the events it did not get to record.

    So a restart mid-share neither repeats the start event nor loses the orders counted before
    it: the next progress row continues the run, or ends it with every shared batch counted. If
    the run had already ended in a progress row whose event was lost, the end (and any later
    start) is returned to be recorded now. A batch that ran twice (a restore) counts once. Only
    the day files from the day before the start event on are read, once, at start-up.
    """
    started = None
    for event in metrics.read_events(data_dir, ("orders_share_started", "orders_share_ended")):
        started = event if event["kind"] == "orders_share_started" else None
    first = (started or {}).get("details", {}).get("batch_id")
    if not isinstance(first, int):
        return None, []
    since_ms = started["ts_ms"] - 86_400_000
    rows = {row["batch_id"]: row for row in metrics.read_rows(data_dir, "progress", since_ms=since_ms)
            if isinstance(row.get("batch_id"), int) and row["batch_id"] >= first}
    share, missed = None, []
    for batch_id in sorted(rows):
        share, event = decide_order_share(share, rows[batch_id])
        if event and (batch_id != first or event[0] != "orders_share_started"):
            missed.append(event)
    if not rows or not rows[min(rows)].get("orders_shared") or min(rows) != first:
        # The batch it started with is gone (a restore, or the retention): keep the run open, uncounted.
        return OrderShare(first, first, int(started["details"].get("held_for") or 0), 0, None), []
    return share, missed


def write_heartbeat(data_dir: Path, ts_ms: int) -> None:
    """Replace the job's heartbeat at once (a reader never sees half of one)."""
    store.replace_file(store.heartbeat_path(data_dir), json.dumps({"ts_ms": int(ts_ms)}))
