"""The driver's event clock (no Spark session): per-partition watermarks from observed metrics,
a topic's as the least of its partitions', idle partitions from read positions, late versions,
the events and the clock file the source reads."""

from __future__ import annotations

import json

from pipeline.enrich import event_clock, event_rules
from pipeline.metrics import MetricsStore, read_events, read_rows
from pipeline.source.clock import read_clock_file


def read_idle(data_dir) -> str | None:
    """The idle changelog partitions the clock file names (``"items,users"``), or None."""
    return ",".join(sorted(read_clock_file(event_clock.clock_file(data_dir)).idle)) or None


def progress(batch: int, second: int, users_n: int, items_n: int, observed: dict, latest_users: int | None = None) -> dict:
    def offsets(users, items):
        return json.dumps({"users": {"gen": 0, "parts": {"-1": {"n": users, "id": "x"}}},
                           "items": {"gen": 0, "parts": {"-1": {"n": items, "id": "x"}}}})
    return {"timestamp": f"2026-01-01T00:00:{second:02d}.000Z", "batchId": batch,
            "eventTime": {"watermark": "2023-11-14T22:13:20.000Z"},
            "observedMetrics": {"event_time_newest": observed},
            "sources": [{"startOffset": None, "endOffset": offsets(users_n, items_n),
                         "latestOffset": offsets(latest_users if latest_users is not None else users_n, items_n)}]}


def test_idle_topics_need_quiet_and_no_backlog():
    assert event_clock.idle_topics({"users": 0, "items": 5_000}, {}, 6_000, 3_000) == {"users"}
    assert event_clock.idle_topics({"users": 0}, {"users": 4}, 6_000, 3_000) == set()  # unread messages wait
    assert event_clock.idle_topics({"users": 0}, {}, 6_000, 0) == set()  # 0: never idle


def test_watermarks_idle_events_and_the_clock_file(tmp_path):
    store = MetricsStore(tmp_path)
    clock = event_clock.EventClockListener(store, tmp_path, out_of_orderness_ms=2_000, idle_timeout_ms=3_000)
    path = tmp_path
    clock.observe(progress(0, 0, 2, 1, {"users": 10_000, "items": 4_000}))
    clock.observe(progress(1, 2, 2, 2, {"items": 6_000}))
    assert read_idle(path) is None
    row = clock.observe(progress(2, 4, 2, 3, {"users": None, "items": 7_000}))
    by_topic = {t["topic"]: t for t in row["topics"]}
    assert by_topic["users"] == {"topic": "users", "newest_ms": 10_000, "watermark_ms": 8_000, "lag_ms": 2_000,
                                 "idle": True, "late_versions": 0, "partitions": []}
    assert by_topic["items"]["watermark_ms"] == 5_000 and not by_topic["items"]["idle"]
    assert read_idle(path) == "users"
    clock.observe(progress(3, 5, 3, 3, {"users": 11_000}))  # users moves again
    assert read_idle(path) is None
    assert [e["kind"] for e in read_events(tmp_path, ("topic_idle", "topic_active"))] == ["topic_idle", "topic_active"]
    assert len(read_rows(tmp_path, "watermarks")) == 4


def test_a_quiet_job_marks_idle_changelogs_on_spark_s_idle_events(tmp_path):
    """Once every topic is read, Spark runs no batch and posts no progress, only idle events: the
    clock must still mark quiet changelogs idle then, or the next orders would wait for a batch
    after them (a job whose input all came at once could hold its orders forever)."""
    from types import SimpleNamespace

    clock = event_clock.EventClockListener(MetricsStore(tmp_path), tmp_path, out_of_orderness_ms=2_000, idle_timeout_ms=3_000)
    clock.observe(progress(0, 0, 2, 1, {"users": 10_000, "items": 4_000}))
    clock.observe(progress(1, 1, 2, 1, {}))  # the last batch came before the timeout
    clock.onQueryIdle(SimpleNamespace(timestamp="2026-01-01T00:00:02.000Z"))
    assert read_idle(tmp_path) is None  # 2 s quiet: not yet
    clock.onQueryIdle(SimpleNamespace(timestamp="2026-01-01T00:00:11.000Z"))
    assert read_idle(tmp_path) == "items,users"
    assert {e["details"]["topic"] for e in read_events(tmp_path, ("topic_idle",))} == {"users", "items"}


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


def partitioned_progress(batch: int, second: int, users_n: dict, observed: dict, late: dict | None = None,
                         latest_users: dict | None = None) -> dict:
    """Progress of a job whose users topic has partitions 0 and 1 (``users_n``: partition -> read)."""
    def offsets(users):
        return json.dumps({"users": {"gen": 0, "parts": {str(p): {"n": n, "id": "x"} for p, n in users.items()}},
                           "items": {"gen": 0, "parts": {"-1": {"n": 5 + batch, "id": "x"}}}})  # items keep moving
    metrics = {"event_time_newest": dict(observed)}
    metrics.update({f"late_versions_{k}": {"count": v} for k, v in (late or {}).items()})
    return {"timestamp": f"2026-01-01T00:00:{second:02d}.000Z", "batchId": batch, "eventTime": {},
            "observedMetrics": metrics,
            "sources": [{"startOffset": None, "endOffset": offsets(users_n),
                         "latestOffset": offsets(latest_users or users_n)}]}


def test_clock_names_and_the_pure_partition_functions():
    from pipeline.enrich.lookups import topic_of_clock
    from pipeline.source.clock import partition_name

    assert (partition_name("users", -1), partition_name("users", 3), topic_of_clock("users/3")) == ("users", "users/3", "users")
    end = {"users": {"gen": 1, "parts": {"0": {"n": 4}, "1": {"n": 9}}}}
    assert event_clock.partition_positions(end, {"users": {"gen": 1, "parts": {"0": {"n": 6}, "1": {"n": 9}}}}) == {
        "users/0": (1, 4, 2), "users/1": (1, 9, 0)}
    assert event_clock.partition_positions(end, {"users": {"gen": 2, "parts": {}}})["users/0"] == (1, 4, None)
    # a topic's watermark is the least of its partitions' that hold it back
    parts = [{"watermark_ms": 5_000, "idle": False}, {"watermark_ms": 9_000, "idle": False}]
    assert event_clock.topic_watermark(parts) == 5_000
    assert event_clock.topic_watermark([{**parts[0], "idle": True}, parts[1]]) == 9_000
    assert event_clock.topic_watermark([{**p, "idle": True} for p in parts]) == 5_000
    assert event_clock.topic_watermark([{"watermark_ms": None, "idle": False}, parts[1]]) is None  # holds at 0
    assert event_clock.idle_topics({"users/0": 0, "users/1": 5_000}, {"users/1": 0}, 6_000, 3_000) == {"users/0"}
    assert event_rules.combined_watermark({"users/0": 9_000, "users/1": 4_000, "items": 8_000}, 1_000) == 3_000
    assert event_rules.combined_watermark({"users/0": 9_000, "users/1": None, "items": 8_000}, 1_000) == 0


def test_one_quiet_partition_goes_idle_alone_and_the_topic_watermark_follows(tmp_path):
    clock = event_clock.EventClockListener(MetricsStore(tmp_path), tmp_path, out_of_orderness_ms=1_000, idle_timeout_ms=3_000)
    path = tmp_path
    first = clock.observe(partitioned_progress(0, 0, {0: 3, 1: 2}, {"users/0": 20_000, "users/1": 6_000, "items": 30_000},
                                               late={"users": 2, "items": 0}))
    users = {t["topic"]: t for t in first["topics"]}["users"]
    assert users["watermark_ms"] == 5_000 and users["newest_ms"] == 20_000 and users["late_versions"] == 2
    assert [(p["partition"], p["watermark_ms"], p["idle"]) for p in users["partitions"]] == [(0, 19_000, False),
                                                                                            (1, 5_000, False)]
    clock.observe(partitioned_progress(1, 2, {0: 5, 1: 2}, {"users/0": 22_000}))
    # partition 1 has not moved for 3 s with nothing unread: idle; partition 0 keeps moving
    row = clock.observe(partitioned_progress(2, 3, {0: 6, 1: 2}, {"users/0": 23_000}))
    users = {t["topic"]: t for t in row["topics"]}["users"]
    assert read_idle(path) == "users/1" and not users["idle"] and users["watermark_ms"] == 22_000
    assert [p["idle"] for p in users["partitions"]] == [False, True]
    idle = read_events(tmp_path, ("topic_idle",))
    assert [(e["details"]["topic"], e["details"]["partition"]) for e in idle] == [("users", 1)]
    assert "users partition 1 has had no new message" in idle[0]["message"]
    clock.observe(partitioned_progress(3, 6, {0: 6, 1: 3}, {"users/1": 7_000}))
    assert read_idle(path) == "users/0"  # 1 moved again; 0 has now been quiet for 3 s
    active = read_events(tmp_path, ("topic_active",))
    assert [(e["details"]["topic"], e["details"]["partition"]) for e in active] == [("users", 1)]


def test_a_partition_with_unread_messages_never_goes_idle(tmp_path):
    clock = event_clock.EventClockListener(MetricsStore(tmp_path), tmp_path, out_of_orderness_ms=1_000, idle_timeout_ms=1_000)
    for batch in range(3):
        clock.observe(partitioned_progress(batch, batch * 5, {0: 3, 1: 2}, {}, latest_users={0: 3, 1: 9}))
    assert read_idle(tmp_path) == "users/0"


def test_the_changelog_partitions_are_asked_with_the_token(monkeypatch):
    from pipeline.source import connection

    asked = []

    def list_partitions(url, topic):
        asked.append((url, topic, connection._tokens.get(url)))
        return ["0", "1"] if topic == "u" else ["-1"]

    monkeypatch.setattr(connection, "_tokens", {})
    monkeypatch.setattr(connection, "list_partitions", list_partitions)
    got = event_clock.changelog_partitions("pulsar://x:1", {"users": "u", "items": "i", "orders": "o"}, token="t")
    assert got == {"users": [0, 1], "items": [-1]}
    assert asked == [("pulsar://x:1", "u", "t"), ("pulsar://x:1", "i", "t")]  # orders hold no watermark


def test_the_clock_file_carries_every_followed_partition_and_the_batch_taken_in(tmp_path):
    """A partition the query follows is in the file before anything is read from it (it holds
    the watermark at 0); the file names the end offset of the batch taken in, which the source's
    planning waits for; the orders' time is not a changelog's."""
    clock = event_clock.EventClockListener(MetricsStore(tmp_path), tmp_path, out_of_orderness_ms=1_000,
                                           idle_timeout_ms=0, partitions={"users": [0, 1], "items": [-1]})
    first = read_clock_file(event_clock.clock_file(tmp_path))
    assert first.newest == {"items": None, "users/0": None, "users/1": None} and first.through is None
    step = partitioned_progress(0, 0, {0: 3, 1: 0}, {"users/0": 20_000, "orders": 99_000})
    clock.observe(step)
    taken = read_clock_file(event_clock.clock_file(tmp_path))
    assert taken.newest == {"items": None, "users/0": 20_000, "users/1": None}
    assert taken.through == json.loads(step["sources"][0]["endOffset"])


