"""The batch planner's figures in the metrics store (pure: no broker, no Spark session).

Progress rows from hand-made progress JSON with the planner's offset fields (``admitted``,
``held_for``, ``shared``) and without them (an old checkpoint); the listener's decision of when
orders start and stop getting a share while the changelogs fill the cap, and how it picks a run
up again after a restart.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from pipeline import metrics
from pipeline.listener import JobListener, OrderShare, decide_order_share, recover_order_share
from pipeline.metrics import MetricsStore, build_progress_row

CHANGELOGS = ("users", "items")


def topic_offset(n: int, *, gen: int = 0, admitted: dict | None = None, **extra) -> dict:
    """One topic's offset: ``{"gen": 0, "base": …, "target": {}, "parts": {"-1": {"n": 5, "id": …}}, …}``."""
    offset = {"gen": gen, "base": {"-1": "earliest"}, "target": {}, "parts": {"-1": {"n": n, "id": f"0:{n}:-1:-1"}}}
    if admitted is not None:
        offset["admitted"] = admitted
    return {**offset, **extra}


def progress_json(batch_id: int, start: dict, end: dict, rows: dict[str, int]) -> dict:
    """Spark's StreamingQueryProgress as JSON, with the source's offsets as JSON text and the
    messages counted per topic partition (observed metric ``source_rows``); timed now, as the
    driver's clock times the listener's events too."""
    return {
        "id": "q", "runId": "r", "batchId": batch_id, "timestamp": metrics.iso(metrics.now_ms()),
        "numInputRows": sum(rows.values()), "inputRowsPerSecond": 10.0, "processedRowsPerSecond": 20.0,
        "batchDuration": 400, "durationMs": {"addBatch": 300, "triggerExecution": 400}, "stateOperators": [],
        "sources": [{"startOffset": json.dumps(start), "endOffset": json.dumps(end), "latestOffset": json.dumps(end)}],
        "observedMetrics": {"source_rows": {f"{kind}/-1": count for kind, count in rows.items()}},
    }


def build_row(progress: dict) -> dict:
    return build_progress_row(progress, 1000, None, None)


# ------------------------------------------------------------------ progress rows


def test_progress_row_carries_what_the_planner_admitted_and_whether_orders_waited():
    start = {"users": topic_offset(100), "items": topic_offset(10), "orders": topic_offset(50)}
    end = {
        "users": topic_offset(140, admitted={"entries": 40, "messages": 4000, "bytes": 880_000}),
        "items": topic_offset(10, admitted={"entries": 0, "messages": 0, "bytes": 0}),
        "orders": topic_offset(50, admitted={"entries": 0, "messages": 0, "bytes": 0}, held_for=3, shared=False),
    }
    row = build_row(progress_json(7, start, end, {"users": 3987, "items": 0, "orders": 0}))
    topics = {topic["topic"]: topic for topic in row["topics"]}
    assert (topics["users"]["rows"], topics["users"]["admitted_messages"], topics["users"]["admitted_bytes"]) == (3987, 4000, 880_000)
    assert (topics["orders"]["admitted_messages"], topics["orders"]["admitted_bytes"]) == (0, 0)
    assert (row["orders_held"], row["orders_shared"], row["orders_held_for"]) == (True, False, 3)


def test_a_shared_batch_is_not_held():
    end = {"users": topic_offset(5, admitted={"entries": 5, "messages": 9000, "bytes": 1_900_000}),
           "items": topic_offset(0, admitted={"entries": 0, "messages": 0, "bytes": 0}),
           "orders": topic_offset(2, admitted={"entries": 2, "messages": 900, "bytes": 250_000}, held_for=11, shared=True)}
    row = build_row(progress_json(8, {}, end, {"users": 9001, "orders": 903}))
    assert (row["orders_held"], row["orders_shared"], row["orders_held_for"]) == (False, True, 11)
    assert [t["admitted_messages"] for t in row["topics"]] == [9000, 0, 900]


def test_old_offsets_without_the_planners_fields_read_as_unknown_and_not_held():
    start = {"users": topic_offset(1), "items": topic_offset(1), "orders": topic_offset(10)}
    end = {"users": topic_offset(1), "items": topic_offset(1), "orders": topic_offset(12)}
    row = build_row(progress_json(3, start, end, {"orders": 2}))
    assert all(t["admitted_messages"] is None and t["admitted_bytes"] is None for t in row["topics"])
    assert (row["orders_held"], row["orders_shared"], row["orders_held_for"]) == (False, False, 0)
    assert next(t for t in row["topics"] if t["topic"] == "orders")["rows"] == 2


def test_a_row_without_offsets_at_all_still_builds():
    progress = progress_json(0, {}, {}, {})
    progress["sources"] = []
    row = build_row(progress)
    assert row["topics"] == [] and (row["orders_held"], row["orders_shared"]) == (False, False)


@pytest.mark.parametrize("admitted", [{"entries": 1}, {"entries": 1, "messages": "3", "bytes": -1}, {"messages": True}])
def test_admitted_figures_that_are_absent_or_not_counts_are_unknown(admitted):
    end = {"orders": topic_offset(1, admitted=admitted)}
    topic = build_row(progress_json(1, {}, end, {"orders": 1}))["topics"][0]
    assert (topic["admitted_messages"], topic["admitted_bytes"]) == (None, None)


# -------------------------------------------------------------------- share decision


def batch(batch_id: int, held_for: int = 0, shared: bool = False, orders: int | None = 0) -> dict:
    """A progress row as build_progress_row writes it, only the fields the decision reads."""
    return {"batch_id": batch_id, "orders_held_for": held_for, "orders_shared": held_for > 0 and shared,
            "orders_held": held_for > 0 and not shared,
            "topics": [{"topic": "users", "rows": 5000}, {"topic": "items", "rows": 0}, {"topic": "orders", "rows": orders}]}


def run(rows: list[dict], share: OrderShare | None = None) -> tuple[OrderShare | None, list[tuple[str, str, dict]]]:
    events = []
    for row in rows:
        share, event = decide_order_share(share, row)
        if event:
            events.append(event)
    return share, events


def test_a_share_starts_when_the_orders_get_one_and_ends_counting_the_orders_admitted_meanwhile():
    share, events = run([batch(1), batch(2, 1), batch(3, 2), batch(4, 3, True, 120), batch(5, 4, True, 80),
                         batch(6, 0, orders=300), batch(7)])
    assert share is None
    (started_kind, started_message, started), (ended_kind, ended_message, ended) = events
    assert (started_kind, started) == ("orders_share_started", {"batch_id": 4, "held_for": 3})
    assert started_message == ("the changelogs filled the batch cap for 3 batches in a row: orders now get a share "
                               "anyway (from batch 4)")
    assert ended_kind == "orders_share_ended"
    assert ended == {"started_batch": 4, "last_batch": 5, "batch_id": 6, "batches": 2, "held_for": 4, "orders": 200,
                     "orders_held": False}
    assert ended_message == ("the changelogs no longer fill the batch cap: 200 orders were admitted while they "
                             "filled it (batches 4-5, 4 in a row at most)")
    assert "\n" not in started_message + ended_message


def test_held_batches_alone_are_no_event():
    assert run([batch(1, 1), batch(2, 2), batch(3), batch(4, 1)]) == (None, [])


def test_a_share_ends_when_the_orders_are_held_back_again():
    share, events = run([batch(1, 5, True, 10), batch(2, 1)])
    assert share is None and events[1][0] == "orders_share_ended"
    assert events[1][2]["orders_held"] is True and events[1][1].startswith("orders are held back for the changelogs again: 10 orders")


def test_an_uncounted_batch_makes_the_count_unknown_not_smaller():
    _, events = run([batch(1, 2, True, 10), batch(2, 3, True, None), batch(3)])
    assert events[1][2]["orders"] is None and "an uncounted number of orders" in events[1][1]


def test_an_open_share_continues_without_a_second_start():
    share, events = run([batch(9, 6, True, 7)], OrderShare(5, 8, 5, 4, 100))
    assert events == [] and share == OrderShare(5, 9, 6, 5, 107)


# ------------------------------------------------------------------- restarts


def write(data_dir: Path, rows: list[dict], events: list[tuple[str, str, dict]]) -> None:
    store = MetricsStore(data_dir)
    for row in rows:
        store.append("progress", {"ts_ms": metrics.now_ms(), **row})
    for kind, message, details in events:
        store.event(kind, message, **details)


def test_a_restart_mid_share_picks_the_run_up_from_the_progress_rows(tmp_path):
    rows = [batch(1, 1), batch(2, 2, True, 30), batch(3, 3, True, 20)]
    share, events = run(rows)
    write(tmp_path, rows, events)  # the process stops here: started, no end
    recovered, missed = recover_order_share(tmp_path)
    assert recovered == share == OrderShare(2, 3, 3, 2, 50) and missed == []
    _, after = run([batch(4, 4, True, 5), batch(5)], recovered)
    assert [kind for kind, _, _ in after] == ["orders_share_ended"] and after[0][2]["orders"] == 55


def test_a_batch_run_twice_counts_once(tmp_path):
    rows = [batch(2, 2, True, 30), batch(3, 3, True, 20)]
    write(tmp_path, rows + [batch(3, 3, True, 20)], run(rows)[1])
    assert recover_order_share(tmp_path)[0].orders == 50


def test_an_end_the_previous_process_did_not_record_is_recorded_at_start_up(tmp_path):
    rows = [batch(2, 2, True, 30), batch(3, 0, orders=9)]
    write(tmp_path, rows, run(rows[:1])[1])  # the end event was lost
    recovered, missed = recover_order_share(tmp_path)
    assert recovered is None and [kind for kind, _, _ in missed] == ["orders_share_ended"] and missed[0][2]["orders"] == 30


def test_nothing_to_recover_after_an_ended_share_or_none(tmp_path):
    assert recover_order_share(tmp_path) == (None, [])
    rows = [batch(2, 2, True, 30), batch(3)]
    write(tmp_path, rows, run(rows)[1])
    assert recover_order_share(tmp_path) == (None, [])


def test_a_start_whose_batch_is_gone_stays_open_and_uncounted(tmp_path):
    write(tmp_path, [], [("orders_share_started", "m", {"batch_id": 40, "held_for": 11})])
    recovered, missed = recover_order_share(tmp_path)
    assert recovered == OrderShare(40, 40, 11, 0, None) and missed == []


def test_the_listener_records_rows_and_share_events_across_a_restart(tmp_path):
    writer = types.SimpleNamespace(publish_committed=lambda batch_id: None, last_counts={})

    def listener() -> JobListener:
        return JobListener(MetricsStore(tmp_path), writer, tmp_path / "checkpoint", 1000, None, "app")

    def progress(batch_id: int, held_for: int, shared: bool, orders: int) -> types.SimpleNamespace:
        admitted = {"entries": 1, "messages": orders, "bytes": orders * 300}
        end = {"users": topic_offset(batch_id, admitted={"entries": 1, "messages": 4000, "bytes": 900_000}),
               "items": topic_offset(0, admitted={"entries": 0, "messages": 0, "bytes": 0}),
               "orders": topic_offset(batch_id, admitted=admitted, held_for=held_for, shared=shared)}
        text = json.dumps(progress_json(batch_id, {}, end, {"users": 4000, "orders": orders}))
        return types.SimpleNamespace(progress=types.SimpleNamespace(json=text))

    first = listener()
    for event in (progress(1, 1, False, 0), progress(2, 2, True, 40)):
        first.onQueryProgress(event)
    second = listener()  # a new job process
    for event in (progress(3, 3, True, 60), progress(4, 0, False, 500)):
        second.onQueryProgress(event)
    events = metrics.read_events(tmp_path, ("orders_share_started", "orders_share_ended"))
    assert [(e["kind"], e["details"].get("orders")) for e in events] == [("orders_share_started", None),
                                                                        ("orders_share_ended", 100)]
    progress_rows = metrics.read_rows(tmp_path, "progress")
    assert [row["orders_held"] for row in progress_rows] == [True, False, False, False]
    assert [row["topics"][2]["admitted_bytes"] for row in progress_rows] == [0, 12_000, 18_000, 150_000]


def test_read_rows_since_skips_the_day_files_before_that_day(tmp_path):
    store, day = MetricsStore(tmp_path), 86_400_000
    for ts_ms in (1, day + 5, 2 * day + 5):  # (0 would mean "now" to append)
        store.append("progress", {"ts_ms": ts_ms, "batch_id": ts_ms})
    assert [row["ts_ms"] for row in metrics.read_rows(tmp_path, "progress", since_ms=day + 10)] == [day + 5, 2 * day + 5]
    assert len(metrics.read_rows(tmp_path, "progress")) == 3
