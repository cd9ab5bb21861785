"""The console's pure computations: skew, backpressure, backlog, job status, replay progress.

How missing state is put in words is app/missing_words.py's.

Plain functions over plain values (the clock is passed in), so each one is unit-tested on
known inputs with no Streamlit and no files. The pages and the exporter both use them, so a
number means the same thing everywhere it is shown.
"""

from __future__ import annotations

import hmac
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd


# ------------------------------------------------------------------------------- skew

SKEW_CAP_PERCENT = 100.0


def compute_skew_percent(records: Sequence[float]) -> float:
    """Flink's data skew of one stage: ``min(mean absolute deviation / mean × 100, 100)``.

    ``records`` holds the record count of each task (subtask) of the stage. 0 % means every
    task got the same number of records; 100 % means the work sits on very few tasks. A stage
    with no records, or with a single task, has no skew.
    """
    values = [float(value) for value in records]
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    if mean <= 0:
        return 0.0
    mean_absolute_deviation = sum(abs(value - mean) for value in values) / len(values)
    return min(mean_absolute_deviation / mean * 100.0, SKEW_CAP_PERCENT)


def compute_skew_by_batch(tasks: pd.DataFrame) -> pd.DataFrame:
    """Skew % per (batch_id, stage) from task rows with ``batch_id, stage, records``.

    Returns ``batch_id, stage, tasks, records, skew_percent`` sorted by batch then stage.
    """
    columns = ["batch_id", "stage", "tasks", "records", "skew_percent"]
    if tasks.empty:
        return pd.DataFrame(columns=columns)
    rows = [
        {
            "batch_id": batch_id,
            "stage": stage,
            "tasks": len(group),
            "records": int(group["records"].sum()),
            "skew_percent": compute_skew_percent(group["records"].tolist()),
        }
        for (batch_id, stage), group in tasks.groupby(["batch_id", "stage"], sort=True)
    ]
    return pd.DataFrame(rows, columns=columns)


# ----------------------------------------------------------------------- backpressure

BACKPRESSURE_OK_MAX = 0.10
BACKPRESSURE_LOW_MAX = 0.50
BACKPRESSURE_DEFINITION = (
    "Backpressure ratio of a batch = max(0, batch duration − trigger interval) ÷ batch duration: "
    "the share of the batch's time spent past its trigger interval, while new messages waited "
    "for the next batch. Levels as in Flink: OK ≤ 10 %, LOW ≤ 50 %, HIGH above."
)


def compute_backpressure_ratio(batch_duration_ms: float | None, trigger_interval_ms: float | None) -> float:
    """The share of a batch's time spent past its trigger interval, from 0 to just under 1.

    ``max(0, duration − interval) / duration``. A batch that ends within its interval scores
    0; one that takes twice the interval scores 0.5, since for half its run the next batch
    was already due and new messages were held back. Missing or zero durations score 0.
    """
    if not batch_duration_ms or batch_duration_ms <= 0 or trigger_interval_ms is None:
        return 0.0
    overrun = max(0.0, float(batch_duration_ms) - float(trigger_interval_ms))
    return overrun / float(batch_duration_ms)


def classify_backpressure(ratio: float) -> str:
    """Flink's backpressure level for a ratio: ``OK`` ≤ 10 %, ``LOW`` ≤ 50 %, ``HIGH`` above."""
    if ratio <= BACKPRESSURE_OK_MAX:
        return "OK"
    if ratio <= BACKPRESSURE_LOW_MAX:
        return "LOW"
    return "HIGH"


def classify_batches(batches: pd.DataFrame) -> pd.DataFrame:
    """``batches`` (with ``batch_duration_ms, trigger_interval_ms``) plus ``backpressure_ratio`` and ``level``."""
    ratios = [
        compute_backpressure_ratio(None if pd.isna(duration) else duration, None if pd.isna(interval) else interval)
        for duration, interval in zip(batches["batch_duration_ms"], batches["trigger_interval_ms"])
    ]
    return batches.assign(backpressure_ratio=ratios, level=[classify_backpressure(ratio) for ratio in ratios])


# ---------------------------------------------------------------------------- backlog


def compute_backlog(end_position: int | None, latest_position: int | None, reported_backlog: int | None) -> int | None:
    """Messages on a topic that the job has not read yet.

    The job's own figure wins when it reported one; otherwise it is the latest position on
    the broker minus the position the job has read to. Unknown when neither is available.
    """
    if not _is_missing(reported_backlog):
        return max(0, int(reported_backlog))
    if _is_missing(end_position) or _is_missing(latest_position):
        return None
    return max(0, int(latest_position) - int(end_position))


def compute_backlog_growth(ts_ms: Sequence[float], backlog: Sequence[float]) -> float | None:
    """How fast a backlog grows, in messages per second: the least-squares slope over time.

    Positive means the job falls behind, negative that it catches up. Needs two points at
    different times; unknown backlogs are skipped.
    """
    points = [(float(t) / 1000.0, float(b)) for t, b in zip(ts_ms, backlog) if not _is_missing(b)]
    if len(points) < 2:
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_b = sum(b for _, b in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    return sum((t - mean_t) * (b - mean_b) for t, b in points) / spread


def _is_missing(value: Any) -> bool:
    """None, NaN or pandas' NA: the ways a frame says "unknown"."""
    return value is None or bool(pd.isna(value))


# -------------------------------------------------------------- admission: changelogs first

ADMISSION_DEFINITION = (
    "Changelogs first: a batch admits orders only once every partition of the users and items "
    "changelogs is admitted up to its newest entry as of planning. Held back: the changelogs alone "
    "filled the batch cap, so the batch admitted no orders. Shared: they have filled it so many "
    "batches in a row (more than job.orders_share_after) that orders get a share anyway. Messages "
    "and bytes admitted are the planner's estimates (it reads no payload); rows are the messages "
    "counted where they were read."
)


def describe_orders_admission(held: Any, shared: Any, held_for: Any) -> str:
    """What the planner did with a batch's orders, in a few words: ``held back (3 in a row)``,
    ``shared (12 in a row)``, ``admitted``, or ``–`` for a row from before the planner said."""
    if _is_missing(held) or _is_missing(shared):
        return "–"
    in_a_row = "" if _is_missing(held_for) or not held_for else f" ({int(held_for)} in a row)"
    if bool(shared):
        return f"shared{in_a_row}"
    if bool(held):
        return f"held back{in_a_row}"
    return "admitted"


def sum_order_shares(orders: Sequence[Any]) -> tuple[int, bool]:
    """Orders admitted while the changelogs filled the cap, over share runs: ``(total, complete)``;
    ``complete`` is False when a run's count is unknown (that run is left out of the total)."""
    known = [int(value) for value in orders if not _is_missing(value)]
    return sum(known), len(known) == len(orders)


# ------------------------------------------------------------------------- job status

LIFECYCLE_KINDS = ("job_started", "restart", "job_failed", "job_stopped")
FRESH_BATCHES = 3  # a running job has written a batch within this many trigger intervals
FRESH_HEARTBEAT_MS = 35_000  # an idle job writes its heartbeat every 10 s (Spark's idle events)


@dataclass(frozen=True)
class JobStatus:
    """What the job is doing, for a banner: ``state`` is a key, ``level`` picks the colour."""

    state: str  # not_started | running | stalled | restarting | failed | stopped
    headline: str
    detail: str
    level: str  # success | info | warning | error


def derive_job_status(
    lifecycle_event: Mapping[str, Any] | None,
    last_progress_ts_ms: int | None,
    trigger_interval_ms: int | None,
    last_batch_duration_ms: int | None,
    now_ms: int,
    heartbeat_ts_ms: int | None = None,
) -> JobStatus:
    """The job's status from its newest lifecycle event and the age of its newest batch.

    ``lifecycle_event`` is the newest of job_started / restart / job_failed / job_stopped as
    ``{"kind", "ts_ms", "message", "details"}``. A batch is fresh when it was written within
    three trigger intervals (or three batch durations, if batches run longer than that).
    A fresh batch newer than the event means the job runs, whatever the event said before. A job
    with nothing to read runs no batch; its heartbeat (``heartbeat_ts_ms``, every 10 s) says it is
    idle, not stopped.
    """
    interval_ms = max(int(trigger_interval_ms or 1000), int(last_batch_duration_ms or 0), 1)
    window_ms = FRESH_BATCHES * interval_ms
    age_ms = None if last_progress_ts_ms is None else max(0, now_ms - int(last_progress_ts_ms))
    fresh = age_ms is not None and age_ms <= window_ms
    event_kind = lifecycle_event.get("kind") if lifecycle_event else None
    event_ts = int(lifecycle_event.get("ts_ms") or 0) if lifecycle_event else 0
    details = dict(lifecycle_event.get("details") or {}) if lifecycle_event else {}
    progress_after_event = last_progress_ts_ms is not None and int(last_progress_ts_ms) >= event_ts

    if event_kind is None and last_progress_ts_ms is None:
        return JobStatus("not_started", "Not started", "No job has run on this data dir yet.", "info")
    if fresh and progress_after_event:
        detail = f"Last batch {format_age(age_ms)} ago."
        if event_kind == "restart":
            detail += f" Recovered after restart {_attempt(details)}."
        return JobStatus("running", "Running", detail, "success")
    beating = (heartbeat_ts_ms is not None and int(heartbeat_ts_ms) >= event_ts
               and now_ms - int(heartbeat_ts_ms) <= FRESH_HEARTBEAT_MS)
    if beating and progress_after_event and event_kind not in ("job_failed", "job_stopped"):
        return JobStatus("running", "Running, idle", f"Nothing new to read; last batch {format_age(age_ms)} ago.",
                         "success")
    if event_kind == "restart" and not progress_after_event:
        error = details.get("error") or lifecycle_event.get("message") or "unknown error"
        delay = details.get("delay_s")
        wait = f", next try {float(delay):g} s after the failure" if delay is not None else ""
        return JobStatus("restarting", f"Restarting {_attempt(details)}", f"{error}{wait}", "warning")
    if event_kind == "job_failed":
        error = details.get("error") or lifecycle_event.get("message") or "unknown error"
        return JobStatus("failed", "Stopped with an error", error, "error")
    if event_kind == "job_stopped":
        return JobStatus("stopped", "Stopped", lifecycle_event.get("message") or "The job was stopped.", "info")
    if not progress_after_event:
        return JobStatus("running", "Starting", "The job started and has not finished a batch yet.", "info")
    return JobStatus(
        "stalled",
        f"No batch for {format_age(age_ms)}",
        "The job has not reported a stop, and no heartbeat says it is idle: it was killed, or hangs.",
        "warning",
    )


def job_status_from_frames(lifecycle_events: pd.DataFrame, newest_batches: pd.DataFrame, now_ms: int,
                           heartbeat_ts_ms: int | None = None) -> JobStatus:
    """:func:`derive_job_status` from the frames of ``load_latest_lifecycle_event`` and
    ``load_batches(limit=1)`` (either may be empty) and the job's heartbeat (``read_heartbeat``)."""
    event = lifecycle_events.iloc[0].to_dict() if not lifecycle_events.empty else None
    batch = newest_batches.iloc[-1] if not newest_batches.empty else None
    return derive_job_status(
        lifecycle_event=event,
        last_progress_ts_ms=None if batch is None else _int_or_none(batch["ts_ms"]),
        trigger_interval_ms=None if batch is None else _int_or_none(batch["trigger_interval_ms"]),
        last_batch_duration_ms=None if batch is None else _int_or_none(batch["batch_duration_ms"]),
        now_ms=now_ms,
        heartbeat_ts_ms=heartbeat_ts_ms,
    )


def _attempt(details: Mapping[str, Any]) -> str:
    return f"{details.get('attempt', '?')}/{details.get('max_attempts', '?')}"


def format_age(age_ms: float) -> str:
    """``850 ms``, ``12 s``, ``3 min 5 s``, ``2 h 4 min``."""
    if age_ms < 1000:
        return f"{int(age_ms)} ms"
    seconds = int(age_ms // 1000)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


# ------------------------------------------------------------------- replay progress


def compute_replay_progress(start_position: int | None, current_position: int | None, target_position: int | None) -> float | None:
    """Share of a replay done, 0 to 1: how far the re-read got from its start to its target."""
    if start_position is None or current_position is None or target_position is None:
        return None
    span = int(target_position) - int(start_position)
    if span <= 0:
        return 1.0
    return min(1.0, max(0.0, (int(current_position) - int(start_position)) / span))


@dataclass(frozen=True)
class ReplayProgress:
    """Where a running replay is: positions on its topic (broker entries), the share done (None
    if unknown) and the messages re-read so far."""

    start_position: int | None
    current_position: int | None
    target_position: int | None
    fraction: float | None
    messages: int = 0


def locate_replay(positions: pd.DataFrame, target_position: int | None, generation: int | None = None) -> ReplayProgress:
    """A replay's progress from its topic's rows in the progress stream since it started.

    ``positions`` has ``generation, rows, end_position, latest_position`` per batch, oldest
    first. The replay reads under its own ``generation`` (the job numbers generations by
    replay seq), or the newest one seen if that is unknown. Positions count broker entries
    from the start of the generation, so it starts at 0; its current position is the newest
    ``end_position``, and its target the ``target_position`` the job announced or, failing
    that, the newest ``latest_position`` of the generation (all it has to re-read so far).
    ``rows`` are messages: their sum is what it re-read so far.
    """
    target = _int_or_none(target_position)
    generations = positions["generation"].fillna(0) if not positions.empty else pd.Series(dtype="int64")
    if generation is not None and (generations == generation).any():
        rows = positions[generations == generation]
    elif not positions.empty:
        rows = positions[generations == generations.max()]
    else:
        return ReplayProgress(None, None, target, None)
    start = 0
    current = int(rows["end_position"].iloc[-1])
    if target is None and "latest_position" in rows:
        target = _int_or_none(rows["latest_position"].iloc[-1])
    messages = int(pd.to_numeric(rows["rows"], errors="coerce").fillna(0).sum())
    return ReplayProgress(start, current, target, compute_replay_progress(start, current, target), messages)


def _int_or_none(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


# -------------------------------------------------------------------------- time axis

NICE_BUCKETS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)


def choose_bucket_seconds(span_seconds: float, max_points: int = 60) -> int:
    """The smallest round bucket width that draws ``span_seconds`` in at most ``max_points``."""
    for bucket in NICE_BUCKETS_S:
        if span_seconds / bucket <= max_points:
            return bucket
    return NICE_BUCKETS_S[-1]


def start_in_window(window_start_ms: int, oldest_row_ms: int | None, started_ms: int | None) -> int | None:
    """When the window holds a start-up, its time: the first enriched rows (the job's first
    batches of orders, which warm Spark up) or the newest job (re)start, whichever is newer and
    inside the window; None when the window is all steady state. A card over such a window says
    so, since those batches weigh on its percentiles."""
    starts = [int(ms) for ms in (oldest_row_ms, started_ms) if ms is not None and int(ms) >= window_start_ms]
    return max(starts) if starts else None


def choose_window(oldest_ms: int, newest_ms: int, max_window_s: int) -> tuple[int, int]:
    """The chart window ``(seconds, bucket seconds)`` ending at the newest row.

    At most ``max_window_s`` long, and no longer than the data itself, so a young job's
    first minute fills the chart instead of a sliver at its right edge.
    """
    span_s = max(1, min(max_window_s, math.ceil((int(newest_ms) - int(oldest_ms)) / 1000) + 1))
    bucket_s = choose_bucket_seconds(span_s)
    return math.ceil(span_s / bucket_s) * bucket_s, bucket_s


# ----------------------------------------------------------------------- admin token


def token_matches(configured_token: str | None, typed_token: str | None) -> bool:
    """Whether a control action may run: always with no token set, else on an exact match.

    The comparison takes the same time however much of the token matches.
    """
    if not configured_token:
        return True
    return hmac.compare_digest((typed_token or "").encode(), configured_token.encode())


# ---------------------------------------------------------------------- personal fields

# Columns the console masks off loopback for viewers without the admin token (README "Console
# safety"): users' names and emails (the sinks' and the state's columns, the pages' user_name,
# the seed's wire fields) and raw dead-letter payloads, compared without case or underscores.
PERSONAL_COLUMNS = frozenset({"userfirstname", "userlastname", "username", "useremail", "firstname", "lastname",
                              "emailaddress", "email", "payload"})
MASK = "•••"


def is_personal_column(name: Any) -> bool:
    return str(name).replace("_", "").lower() in PERSONAL_COLUMNS


def mask_value(value: Any) -> Any:
    """A personal value as :data:`MASK`; a missing one stays missing."""
    if value is None or (not isinstance(value, (list, dict)) and pd.isna(value)):
        return value
    return MASK
