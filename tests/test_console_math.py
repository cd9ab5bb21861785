"""The console's pure computations on known inputs: skew, backpressure, backlog, job status,
replay progress, chart windows and the admin token check."""

from __future__ import annotations

import pandas as pd
import pytest

from app import console_math as cm
from app import missing_words

NOW = 1_800_000_000_000


# ------------------------------------------------------------------------------- skew

@pytest.mark.parametrize(("records", "expected"), [
    ([10, 10, 10, 10], 0.0),            # even
    ([20, 0, 20, 0], 100.0),            # MAD 10, mean 10
    ([15, 5, 10, 10], 25.0),            # MAD (5+5+0+0)/4 = 2.5, mean 10
    ([30, 2, 6, 2], 100.0),             # MAD 10, mean 10
    ([40, 0, 0, 0], 100.0),             # 150 % capped at 100
    ([12, 8], 20.0),                    # MAD 2, mean 10
    ([7], 0.0),                         # one task cannot be skewed
    ([0, 0, 0], 0.0),                   # no records
    ([], 0.0),
])
def test_skew_percent_is_flinks_mean_absolute_deviation_over_mean(records, expected):
    assert cm.compute_skew_percent(records) == pytest.approx(expected)


def test_skew_by_batch_groups_tasks_per_batch_and_stage():
    tasks = pd.DataFrame({
        "batch_id": [1, 1, 1, 1, 2, 2],
        "stage": ["user_lookup", "user_lookup", "item_lookup", "item_lookup", "user_lookup", "user_lookup"],
        "records": [12, 8, 5, 5, 30, 0],
    })
    skew = cm.compute_skew_by_batch(tasks)
    assert skew.to_dict("records") == [
        {"batch_id": 1, "stage": "item_lookup", "tasks": 2, "records": 10, "skew_percent": 0.0},
        {"batch_id": 1, "stage": "user_lookup", "tasks": 2, "records": 20, "skew_percent": pytest.approx(20.0)},
        {"batch_id": 2, "stage": "user_lookup", "tasks": 2, "records": 30, "skew_percent": 100.0},
    ]
    assert cm.compute_skew_by_batch(tasks.iloc[0:0]).empty


# ----------------------------------------------------------------------- backpressure

@pytest.mark.parametrize(("duration", "interval", "ratio", "level"), [
    (400, 1000, 0.0, "OK"),          # within the interval
    (1000, 1000, 0.0, "OK"),
    (1100, 1000, 100 / 1100, "OK"),  # 9.1 % over
    (1200, 1000, 200 / 1200, "LOW"),
    (2000, 1000, 0.5, "LOW"),        # exactly 50 % is still LOW
    (2100, 1000, 1100 / 2100, "HIGH"),
    (10_000, 1000, 0.9, "HIGH"),
    (0, 1000, 0.0, "OK"),
    (None, 1000, 0.0, "OK"),
])
def test_backpressure_ratio_and_flink_levels(duration, interval, ratio, level):
    assert cm.compute_backpressure_ratio(duration, interval) == pytest.approx(ratio)
    assert cm.classify_backpressure(cm.compute_backpressure_ratio(duration, interval)) == level


def test_level_boundaries_are_inclusive():
    assert cm.classify_backpressure(0.10) == "OK"
    assert cm.classify_backpressure(0.1000001) == "LOW"
    assert cm.classify_backpressure(0.50) == "LOW"
    assert cm.classify_backpressure(0.5000001) == "HIGH"


def test_classify_batches_adds_ratio_and_level_per_row():
    batches = pd.DataFrame({"batch_duration_ms": [500, 1500, 4000], "trigger_interval_ms": [1000, 1000, 1000]})
    classified = cm.classify_batches(batches)
    assert classified["level"].tolist() == ["OK", "LOW", "HIGH"]
    assert classified["backpressure_ratio"].tolist() == pytest.approx([0.0, 1 / 3, 0.75])


# ---------------------------------------------------------------------------- backlog

@pytest.mark.parametrize(("end", "latest", "reported", "expected"), [
    (100, 130, None, 30),
    (100, 130, 12, 12),      # the job's own figure wins
    (130, 100, None, 0),     # never negative
    (100, None, None, None),
    (None, 130, None, None),
    (100, float("nan"), None, None),
    (100, pd.NA, pd.NA, None),
])
def test_backlog(end, latest, reported, expected):
    assert cm.compute_backlog(end, latest, reported) == expected


def test_backlog_growth_is_the_least_squares_slope_in_messages_per_second():
    assert cm.compute_backlog_growth([0, 1000, 2000, 3000], [10, 20, 30, 40]) == pytest.approx(10.0)
    assert cm.compute_backlog_growth([0, 1000, 2000], [50, 30, 10]) == pytest.approx(-20.0)
    assert cm.compute_backlog_growth([0, 1000, 2000], [5, None, 25]) == pytest.approx(10.0)
    assert cm.compute_backlog_growth([0, 1000, 2000], [pd.NA, 5, 15]) == pytest.approx(10.0)  # an Int64 column
    assert cm.compute_backlog_growth([0], [5]) is None
    assert cm.compute_backlog_growth([1000, 1000], [5, 9]) is None


# ------------------------------------------------------------------------- job status

def _event(kind, ts_ms, **details):
    return {"kind": kind, "ts_ms": ts_ms, "message": f"{kind} message", "details": details}


def test_status_not_started_without_events_or_batches():
    status = cm.derive_job_status(None, None, None, None, NOW)
    assert (status.state, status.headline) == ("not_started", "Not started")


def test_status_running_when_a_batch_is_within_three_trigger_intervals():
    status = cm.derive_job_status(_event("job_started", NOW - 60_000), NOW - 2_500, 1000, 300, NOW)
    assert (status.state, status.level) == ("running", "success")
    assert "2 s ago" in status.detail


def test_status_stalled_when_the_newest_batch_is_older_than_three_intervals():
    status = cm.derive_job_status(_event("job_started", NOW - 60_000), NOW - 3_500, 1000, 300, NOW)
    assert status.state == "stalled"
    assert status.headline == "No batch for 3 s"


def test_an_idle_job_with_a_fresh_heartbeat_runs_and_one_without_has_stalled():
    started = _event("job_started", NOW - 600_000)
    idle = cm.derive_job_status(started, NOW - 300_000, 1000, 300, NOW, heartbeat_ts_ms=NOW - 8_000)
    assert (idle.state, idle.headline, idle.level) == ("running", "Running, idle", "success")
    assert idle.detail == "Nothing new to read; last batch 5 min 0 s ago."
    # a heartbeat older than three idle events (10 s each): killed, or hangs
    assert cm.derive_job_status(started, NOW - 300_000, 1000, 300, NOW, heartbeat_ts_ms=NOW - 40_000).state == "stalled"
    # a stop or a failure after the last heartbeat is what the job is now
    stopped = _event("job_stopped", NOW - 5_000)
    assert cm.derive_job_status(stopped, NOW - 300_000, 1000, 300, NOW, heartbeat_ts_ms=NOW - 8_000).state == "stopped"
    failed = _event("job_failed", NOW - 9_000, error="boom")
    assert cm.derive_job_status(failed, NOW - 300_000, 1000, 300, NOW, heartbeat_ts_ms=NOW - 8_000).state == "failed"


def test_long_batches_widen_the_freshness_window():
    # Batches of 4 s on a 1 s trigger: a batch 10 s ago is still fresh (3 × 4 s).
    assert cm.derive_job_status(_event("job_started", 0), NOW - 10_000, 1000, 4000, NOW).state == "running"


def test_status_restarting_shows_attempt_of_max_and_the_error():
    event = _event("restart", NOW - 4000, attempt=2, max_attempts=5, error="PulsarException: connection lost", delay_s=10)
    status = cm.derive_job_status(event, NOW - 6000, 1000, 300, NOW)
    assert (status.state, status.headline) == ("restarting", "Restarting 2/5")
    assert "PulsarException: connection lost" in status.detail


def test_status_running_again_after_a_restart_once_batches_flow():
    event = _event("restart", NOW - 20_000, attempt=1, max_attempts=5, error="boom")
    status = cm.derive_job_status(event, NOW - 500, 1000, 300, NOW)
    assert status.state == "running"
    assert "Recovered after restart 1/5" in status.detail


def test_status_failed_carries_the_error():
    status = cm.derive_job_status(_event("job_failed", NOW - 1000, error="gave up after 5 restarts: boom"),
                                  NOW - 9000, 1000, 300, NOW)
    assert (status.state, status.level) == ("failed", "error")
    assert status.detail == "gave up after 5 restarts: boom"


def test_status_stopped_and_starting():
    assert cm.derive_job_status(_event("job_stopped", NOW - 1000), NOW - 2000, 1000, 300, NOW).state == "stopped"
    starting = cm.derive_job_status(_event("job_started", NOW - 1000), NOW - 50_000, 1000, 300, NOW)
    assert (starting.state, starting.headline) == ("running", "Starting")


def test_job_status_from_frames_uses_the_newest_batch():
    events = pd.DataFrame([_event("job_started", NOW - 60_000)])
    batches = pd.DataFrame({"ts_ms": [NOW - 9000, NOW - 1000], "trigger_interval_ms": [1000, 1000],
                            "batch_duration_ms": [200, 200]})
    assert cm.job_status_from_frames(events, batches, NOW).state == "running"
    assert cm.job_status_from_frames(events.iloc[0:0], batches.iloc[0:0], NOW).state == "not_started"


# --------------------------------------------------------------------- replay progress

def test_replay_progress_between_start_and_target():
    assert cm.compute_replay_progress(0, 25, 100) == pytest.approx(0.25)
    assert cm.compute_replay_progress(50, 75, 150) == pytest.approx(0.25)
    assert cm.compute_replay_progress(0, 120, 100) == 1.0
    assert cm.compute_replay_progress(0, 10, 0) == 1.0
    assert cm.compute_replay_progress(None, 10, 100) is None


def test_locate_replay_reads_its_own_generation():
    positions = pd.DataFrame({
        "generation": [1, 1, 2, 2, 2],
        "rows": [5, 5, 30, 40, 30],
        "end_position": [900, 905, 30, 70, 100],
        "latest_position": [905, 910, 400, 400, 400],
    })
    progress = cm.locate_replay(positions, target_position=200, generation=2)
    assert (progress.start_position, progress.current_position, progress.target_position) == (0, 100, 200)
    assert progress.fraction == pytest.approx(0.5)
    # With no target announced, the generation's newest latest_position stands in for it.
    assert cm.locate_replay(positions, None, generation=2).fraction == pytest.approx(100 / 400)
    assert cm.locate_replay(positions.iloc[0:0], 200, generation=2).fraction is None


# ------------------------------------------------------------ windows, text and token

@pytest.mark.parametrize(("span", "bucket"), [(30, 1), (60, 1), (61, 2), (900, 15), (3600, 60), (10 ** 7, 86400)])
def test_bucket_width_keeps_charts_under_sixty_points(span, bucket):
    assert cm.choose_bucket_seconds(span) == bucket


def test_chart_window_is_no_longer_than_the_data():
    assert cm.choose_window(NOW - 29_500, NOW, 900) == (31, 1)
    assert cm.choose_window(NOW - 3_600_000, NOW, 900) == (900, 15)


def test_missing_state_descriptions():
    assert missing_words.describe_missing_reason("user", 42, 7, 10_000) == "user 42 not in state after waiting 10 s"
    assert missing_words.describe_missing_reason("user_and_item", 42, 7, 0) == "neither user 42 nor item 7 in state (buffering is off)"
    assert missing_words.describe_appearance("item", "user", None) == "was in state"
    assert missing_words.describe_appearance("user", "user", None) == "not yet"
    assert missing_words.describe_appearance("user", "user", pd.Timestamp("2026-11-22 01:02:03")) == "yes, 2026-11-22 01:02:03 UTC"
    assert missing_words.describe_redrive(None, pd.Timestamp("2026-11-22 01:02:03"), None) == "re-driven, enriched 2026-11-22 01:02:03 UTC"
    assert missing_words.describe_redrive("1:2:-1:0", None, pd.NaT) == "re-drive of 1:2:-1:0"


def test_token_check():
    assert cm.token_matches(None, None)
    assert cm.token_matches("", "anything")
    assert cm.token_matches("s3cret", "s3cret")
    assert not cm.token_matches("s3cret", "s3cre")
    assert not cm.token_matches("s3cret", None)


# ------------------------------------------------------------ admission: changelogs first

@pytest.mark.parametrize(("held", "shared", "held_for", "expected"), [
    (True, False, 3, "held back (3 in a row)"),
    (False, True, 12, "shared (12 in a row)"),
    (False, False, 0, "admitted"),
    (None, None, None, "–"),                  # a progress row from before the planner said
    (pd.NA, pd.NA, pd.NA, "–"),
    (True, False, None, "held back"),
])
def test_orders_admission_in_a_few_words(held, shared, held_for, expected):
    assert cm.describe_orders_admission(held, shared, held_for) == expected


def test_orders_shared_sum_the_known_runs_and_say_when_one_is_unknown():
    assert cm.sum_order_shares([80, 120]) == (200, True)
    assert cm.sum_order_shares([80, None, float("nan")]) == (80, False)
    assert cm.sum_order_shares([]) == (0, True)


def test_a_window_that_holds_a_start_up_says_when():
    from app.console_math import start_in_window

    assert start_in_window(1_000, oldest_row_ms=1_500, started_ms=None) == 1_500  # the first enriched rows
    assert start_in_window(1_000, oldest_row_ms=500, started_ms=2_000) == 2_000  # a restart inside the window
    assert start_in_window(1_000, oldest_row_ms=500, started_ms=900) is None  # all steady state
    assert start_in_window(1_000, oldest_row_ms=None, started_ms=None) is None
