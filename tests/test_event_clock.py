"""The driver's event clock (no Spark session): per-topic watermarks from observed metrics,
idle changelogs from read positions, the events and the file the parse step reads."""

from __future__ import annotations

import json

from pipeline.enrich import event_clock
from pipeline.enrich.parse import read_idle
from pipeline.metrics import MetricsStore, read_events, read_rows


def progress(batch: int, second: int, users_n: int, items_n: int, observed: dict, latest_users: int | None = None) -> dict:
    def offsets(users, items):
        return json.dumps({"users": {"gen": 0, "parts": {"-1": {"n": users, "id": "x"}}},
                           "items": {"gen": 0, "parts": {"-1": {"n": items, "id": "x"}}}})
    return {"timestamp": f"2026-01-01T00:00:{second:02d}.000Z", "batchId": batch,
            "eventTime": {"watermark": "2023-11-14T22:13:20.000Z"},
            "observedMetrics": {f"event_time_{k}": {"newest_ms": v} for k, v in observed.items()},
            "sources": [{"startOffset": None, "endOffset": offsets(users_n, items_n),
                         "latestOffset": offsets(latest_users if latest_users is not None else users_n, items_n)}]}


def test_idle_topics_need_quiet_and_no_backlog():
    assert event_clock.idle_topics({"users": 0, "items": 5_000}, {}, 6_000, 3_000) == {"users"}
    assert event_clock.idle_topics({"users": 0}, {"users": 4}, 6_000, 3_000) == set()  # unread messages wait
    assert event_clock.idle_topics({"users": 0}, {}, 6_000, 0) == set()  # 0: never idle


def test_watermarks_idle_events_and_the_parse_steps_file(tmp_path):
    store = MetricsStore(tmp_path)
    clock = event_clock.EventClockListener(store, tmp_path, out_of_orderness_ms=2_000, idle_timeout_ms=3_000)
    path = str(event_clock.idle_file(tmp_path))
    clock.observe(progress(0, 0, 2, 1, {"users": 10_000, "items": 4_000}))
    clock.observe(progress(1, 2, 2, 2, {"items": 6_000}))
    assert read_idle(path) is None
    row = clock.observe(progress(2, 4, 2, 3, {"users": None, "items": 7_000}))
    by_topic = {t["topic"]: t for t in row["topics"]}
    assert by_topic["users"] == {"topic": "users", "newest_ms": 10_000, "watermark_ms": 8_000, "lag_ms": 2_000,
                                 "idle": True}
    assert by_topic["items"]["watermark_ms"] == 5_000 and not by_topic["items"]["idle"]
    assert read_idle(path) == "users"
    clock.observe(progress(3, 5, 3, 3, {"users": 11_000}))  # users moves again
    assert read_idle(path) is None
    assert [e["kind"] for e in read_events(tmp_path, ("topic_idle", "topic_active"))] == ["topic_idle", "topic_active"]
    assert len(read_rows(tmp_path, "watermarks")) == 4


def test_the_backpressure_query_reads_the_newest_watermarks(tmp_path):
    import duckdb

    from app import metric_queries

    clock = event_clock.EventClockListener(MetricsStore(tmp_path), tmp_path, out_of_orderness_ms=2_000, idle_timeout_ms=3_000)
    clock.observe(progress(0, 0, 2, 1, {"users": 10_000, "items": 4_000}))
    clock.observe(progress(1, 4, 2, 2, {"items": 6_000}))
    frame = metric_queries.load_watermarks(duckdb.connect(), tmp_path)
    assert frame["topic"].tolist() == ["items", "users"] and frame["batch_id"].tolist() == [1, 1]
    assert frame["lag_ms"].tolist() == [6_000, 2_000] and frame["idle"].tolist() == [False, True]
    assert str(frame["watermark"].iloc[1]) == "1970-01-01 00:00:08"


def test_a_restart_takes_each_changelogs_newest_time_as_of_the_last_commit(tmp_path):
    from pipeline import store

    checkpoint = store.checkpoint_dir(tmp_path)
    (checkpoint / "commits").mkdir(parents=True)
    assert event_clock.restored_newest(checkpoint) == {}  # nothing committed: every changelog starts at 0
    clock = event_clock.EventClockListener(MetricsStore(tmp_path), tmp_path, out_of_orderness_ms=2_000, idle_timeout_ms=0)
    clock.observe(progress(0, 0, 2, 1, {"users": 10_000, "items": 4_000}))
    clock.observe(progress(1, 1, 3, 1, {"users": 12_000}))
    (checkpoint / "commits" / "0").write_text("v1")
    # batch 1 is not committed in this checkpoint (a savepoint taken before it): batch 0's times
    assert event_clock.restored_newest(checkpoint) == {"users": 10_000, "items": 4_000}
    (checkpoint / "commits" / "1").write_text("v1")
    assert event_clock.restored_newest(checkpoint) == {"users": 12_000, "items": 4_000}
    again = event_clock.EventClockListener(MetricsStore(tmp_path), tmp_path, out_of_orderness_ms=2_000, idle_timeout_ms=0)
    assert again.newest == {"users": 12_000, "items": 4_000}
