"""Readers that read only what they need (issue 28, item 2): the newest lines of the metrics
store, a cursor over what was appended since, and the running totals built on them (the state
census, a replay's messages, the exporter's counters), each checked against a full recount of
the store, across restarts, day files and a half-written last line. Pure: no Spark, no broker."""

from __future__ import annotations

import json

import pytest

from pipeline import store
from pipeline.metrics import MetricsStore, read_events, read_rows
from pipeline.metrics_tail import StreamTail, parse_lines, tail_lines

DAY_MS = 86_400_000
BASE_MS = 1_800_000_000_000  # 2027-01-15T08:00:00Z


def progress_row(batch_id: int, ts_ms: int, **topic) -> dict:
    """A progress row with what the running totals read: state rows per operator and topic rows."""
    topics = [{"topic": "orders", "generation": 0, "rows": batch_id % 7, "replaying": False}]
    if topic:
        topics.append({"topic": "users", "rows": 0, "replaying": False, "latest_position": 100, **topic})
    return {"ts_ms": ts_ms, "batch_id": batch_id, "num_input_rows": batch_id % 7, "topics": topics,
            "state": [{"operator": "user_lookup", "rows_total": 1000 + batch_id},
                      {"operator": "item_lookup", "rows_total": 50 + batch_id}],
            "sink_rows": {"enriched": batch_id % 5, "missing_state": batch_id % 3, "dead_letter": batch_id % 2}}


def write_progress(data_dir, batches: range, start_ms: int = BASE_MS, step_ms: int = 3_600_000) -> None:
    metrics = MetricsStore(data_dir)
    for batch_id in batches:
        metrics.append("progress", progress_row(batch_id, start_ms + batch_id * step_ms))


def half_write(data_dir, stream: str) -> None:
    """What a reader sees while the job is in the middle of appending a row."""
    newest = sorted(store.metrics_dir(data_dir, stream).glob("*.jsonl"))[-1]
    with open(newest, "a", encoding="utf-8") as handle:
        handle.write('{"ts_ms": 1, "batch_id": 99')


# ------------------------------------------------------------------------- the newest lines


@pytest.mark.parametrize("n", [0, 1, 5, 23, 24, 25, 60, 100])
def test_the_newest_lines_are_the_last_rows_of_the_store_across_day_files(tmp_path, n):
    write_progress(tmp_path, range(60))  # one an hour: three day files
    half_write(tmp_path, "progress")
    assert len(list(store.metrics_dir(tmp_path, "progress").glob("*.jsonl"))) == 3
    lines, whole = tail_lines(tmp_path, "progress", n)
    everything = read_rows(tmp_path, "progress")
    assert parse_lines(lines) == (everything[-n:] if n else [])
    assert whole == (n >= len(everything))


def test_the_newest_lines_of_long_rows_need_several_blocks(tmp_path):
    metrics = MetricsStore(tmp_path)
    for batch_id in range(40):
        metrics.append("progress", {"ts_ms": BASE_MS, "batch_id": batch_id, "pad": "x" * 20_000})
    lines, whole = tail_lines(tmp_path, "progress", 30)
    assert [row["batch_id"] for row in parse_lines(lines)] == list(range(10, 40)) and not whole


def test_an_empty_or_missing_stream_has_no_lines(tmp_path):
    assert tail_lines(tmp_path, "progress", 10) == ([], True)
    assert StreamTail(tmp_path, "progress").read_new() == []


# ------------------------------------------------------------------- what was appended since


def test_a_tail_returns_each_row_once_across_days_half_lines_and_retention(tmp_path):
    write_progress(tmp_path, range(30))
    half_write(tmp_path, "progress")
    tail = StreamTail(tmp_path, "progress")
    seen = tail.read_new()
    assert seen == read_rows(tmp_path, "progress")  # the half line is not a row yet
    newest = sorted(store.metrics_dir(tmp_path, "progress").glob("*.jsonl"))[-1]
    with open(newest, "a", encoding="utf-8") as handle:  # the job finishes the line
        handle.write(', "ts_ms": 5}\n')
    finished = tail.read_new()
    assert [row["batch_id"] for row in finished] == [99]
    write_progress(tmp_path, range(30, 80))  # two more days
    oldest = sorted(store.metrics_dir(tmp_path, "progress").glob("*.jsonl"))[0]
    oldest.unlink()  # the retention at work
    seen += finished + tail.read_new()
    assert sorted(row["batch_id"] for row in seen) == list(range(80)) + [99]
    assert tail.read_new() == []


def test_a_row_written_late_for_the_previous_day_is_read(tmp_path):
    metrics = MetricsStore(tmp_path)
    metrics.append("tasks", {"ts_ms": BASE_MS, "batch_id": 1})
    metrics.append("tasks", {"ts_ms": BASE_MS + DAY_MS, "batch_id": 2})
    tail = StreamTail(tmp_path, "tasks")
    assert [row["batch_id"] for row in tail.read_new()] == [1, 2]
    metrics.append("tasks", {"ts_ms": BASE_MS + 1, "batch_id": 3})  # yesterday's file, after today's began
    assert [row["batch_id"] for row in tail.read_new()] == [3]


def test_a_tail_from_the_newest_rows_reads_nothing_older(tmp_path):
    write_progress(tmp_path, range(60))
    tail = StreamTail(tmp_path, "progress", newest=30)
    assert [row["batch_id"] for row in tail.read_new()] == list(range(30, 60))
    write_progress(tmp_path, range(60, 62))
    assert [row["batch_id"] for row in tail.read_new()] == [60, 61]


# ------------------------------------------------------------------------ the state census


def commit(data_dir, batch_id: int) -> None:
    """The checkpoint's commit log as Spark leaves it: one file per committed batch."""
    commits = store.checkpoint_dir(data_dir) / "commits"
    commits.mkdir(parents=True, exist_ok=True)
    for name in [path.name for path in commits.iterdir()]:
        if int(name) > batch_id:  # a restore takes the commit log back
            (commits / name).unlink()
    (commits / str(batch_id)).write_text("v1\n{}")


def recounted_census(data_dir, batch_id: int) -> dict:
    """What the census counted before it kept running totals: the newest progress row of the
    committed batch, found by reading every row ever written."""
    newest = [row for row in read_rows(data_dir, "progress") if row["batch_id"] == batch_id][-1]
    return {("users" if op["operator"] == "user_lookup" else "items"): op["rows_total"] for op in newest["state"]}


def census_of(census) -> dict:
    return {row["lookup"]: row["state_rows"] for row in census.take()}


def test_the_census_equals_a_full_recount_after_restarts_and_a_restore(tmp_path):
    from pipeline.control.state import StateCensus

    metrics = MetricsStore(tmp_path)
    start = lambda: StateCensus(None, store.checkpoint_dir(tmp_path), metrics, max_wait_ms=0)  # noqa: E731
    census = start()
    write_progress(tmp_path, range(40), step_ms=60_000)
    commit(tmp_path, 39)
    assert census_of(census) == recounted_census(tmp_path, 39)
    assert census.take() == []  # nothing new committed: no census
    census = start()  # the job restarts: the new census starts from the newest rows
    write_progress(tmp_path, range(40, 2000), step_ms=60_000)  # across days
    commit(tmp_path, 1999)
    assert census_of(census) == recounted_census(tmp_path, 1999)
    # A restore to batch 1500: the batches after it run again, with other state.
    commit(tmp_path, 1500)
    census = start()
    for batch_id in range(1501, 1600):
        row = progress_row(batch_id, BASE_MS + 2000 * 60_000 + batch_id)
        row["state"][0]["rows_total"] += 12_345
        metrics.append("progress", row)
    commit(tmp_path, 1599)
    assert census_of(census) == recounted_census(tmp_path, 1599) == {"users": 1000 + 1599 + 12_345,
                                                                      "items": 50 + 1599}
    half_write(tmp_path, "progress")
    assert census.take() == []  # a half-written row is no batch


# ---------------------------------------------------------------------- a replay's messages


def replay_row(batch_id: int, rows: int, replaying: bool = True) -> dict:
    return progress_row(batch_id, BASE_MS + batch_id * 600_000, generation=1, rows=rows, replaying=replaying)


def start_listener(data_dir):
    from pipeline.listener import JobListener

    return JobListener(MetricsStore(data_dir), None, store.checkpoint_dir(data_dir), 1000, None, "app")


def feed(listener, row: dict) -> None:
    """What the listener does with a batch's progress row: append it, then count it."""
    listener.store.append("progress", row)
    listener._record_replays(row)


@pytest.mark.parametrize("crash_before_start_event", [False, True])
def test_a_replays_messages_equal_a_full_recount_after_restarts(tmp_path, crash_before_start_event):
    from pipeline.listener import replayed_messages

    listener = start_listener(tmp_path)
    first = replay_row(0, 17)
    if crash_before_start_event:  # the row is written, the process dies before its start event
        listener.store.append("progress", first)
    else:
        feed(listener, first)
    listener = start_listener(tmp_path)
    for batch_id in range(1, 300):  # across days, with a restart every 100 batches
        if batch_id % 100 == 0:
            listener = start_listener(tmp_path)
        feed(listener, replay_row(batch_id, batch_id % 11))
    feed(listener, replay_row(300, 4, replaying=False))
    feed(listener, replay_row(301, 5, replaying=False))  # after the end: not the replay's any more
    (started,) = read_events(tmp_path, ("replay_started",))
    (finished,) = read_events(tmp_path, ("replay_finished",))
    assert started["details"]["seq"] == finished["details"]["seq"] == 1
    recount = replayed_messages(read_rows(tmp_path, "progress")[:-1], "users", 1)
    assert finished["details"]["messages"] == recount == 17 + sum(b % 11 for b in range(1, 300)) + 4


# ------------------------------------------------------------------ the exporter's counters


def test_the_exporters_running_totals_equal_a_full_recount_after_restarts(tmp_path):
    from app import metric_queries, sources
    from app.store_totals import RunningTotals

    connection = sources.connect()

    def recount() -> tuple:
        totals = metric_queries.load_progress_totals(connection, tmp_path).iloc[0]
        events = metric_queries.load_event_counts(connection, tmp_path).set_index("kind")["events"]
        return (int(totals["batches"]), int(totals["enriched_rows"]), int(totals["missing_rows"]),
                int(totals["dead_letter_rows"]), {kind: int(n) for kind, n in events.items()})

    def running(totals) -> tuple:
        read = totals.read()
        return (read.batches, read.enriched_rows, read.missing_rows, read.dead_letter_rows, dict(read.events))

    metrics = MetricsStore(tmp_path)
    totals = RunningTotals(tmp_path)
    assert running(totals) == recount() == (0, 0, 0, 0, {})
    write_progress(tmp_path, range(50))
    metrics.event("restart", "attempt 1 of 5")
    half_write(tmp_path, "progress")
    assert running(totals) == recount()
    newest = sorted(store.metrics_dir(tmp_path, "progress").glob("*.jsonl"))[-1]
    with open(newest, "a", encoding="utf-8") as handle:  # the half line is finished: one more batch
        handle.write(', "ts_ms": ' + str(BASE_MS) + ', "sink_rows": {"enriched": 3}}\n')
    write_progress(tmp_path, range(50, 120))
    metrics.event("restart", "attempt 2 of 5")
    metrics.event("job_started", "again")
    assert running(totals) == recount()
    assert running(RunningTotals(tmp_path)) == recount()  # the exporter restarts
    connection.close()


# ------------------------------------------------------------------ the console's windows


def test_the_consoles_windows_never_open_an_older_day_file(tmp_path):
    """The newest-rows queries read the last lines of the newest day files only: an older day
    file that could not even be opened (here a folder in its place) changes nothing."""
    from app import metric_queries, sources

    metrics = MetricsStore(tmp_path)
    write_progress(tmp_path, range(72))  # 3 days, one batch an hour
    for batch_id in range(72):
        for task in range(8):
            metrics.append("tasks", {"ts_ms": BASE_MS + batch_id * 3_600_000, "batch_id": batch_id,
                                     "stage": "user_lookup", "stage_id": 3, "task": task, "records": task, "duration_ms": 1})
    connection = sources.connect()
    windows = {
        "batches": lambda: metric_queries.load_batches(connection, tmp_path, limit=30),
        "backlog": lambda: metric_queries.load_backlog(connection, tmp_path, limit=30),
        "partitions": lambda: metric_queries.load_partition_rows(connection, tmp_path, batches=30),
        "operators": lambda: metric_queries.load_state_by_operator(connection, tmp_path),
        "tasks": lambda: metric_queries.load_recent_tasks(connection, tmp_path, batches=20),
        "positions": lambda: metric_queries.load_topic_positions(connection, tmp_path, "orders", BASE_MS + 60 * 3_600_000),
        "shares": lambda: metric_queries.load_order_shares(connection, tmp_path),
    }
    before = {name: query() for name, query in windows.items()}
    assert before["batches"]["batch_id"].tolist() == list(range(42, 72))
    assert sorted(before["tasks"]["batch_id"].unique()) == list(range(52, 72)) and len(before["tasks"]) == 160
    for stream in ("progress", "tasks"):
        oldest = sorted(store.metrics_dir(tmp_path, stream).glob("*.jsonl"))[0]
        oldest.unlink()
        oldest.mkdir()  # opening it as a file fails
    for name, query in windows.items():
        assert query().equals(before[name]), name
    connection.close()


@pytest.mark.parametrize("line", [
    json.dumps(progress_row(7, BASE_MS), separators=(",", ":")),  # as the job writes it
    json.dumps(progress_row(8, BASE_MS)),  # spaced
    json.dumps({**progress_row(9, BASE_MS), "sink_rows": None}),
    json.dumps({key: value for key, value in progress_row(10, BASE_MS).items() if key != "sink_rows"}),
    json.dumps({**progress_row(11, BASE_MS), "note": "a \"sink_rows\": {\"enriched\": 99} in a string"}),
    json.dumps({"sink_rows": {"enriched": 1}, "state": [{"custom": {"sink_rows": {"enriched": 5}}}]}),
    '{"ts_ms": 1, "sink_rows": {"enriched": 3, "missing_state": 1, "dead_letter": 0}',  # half written
    '[1, 2]', '"sink_rows"', '',
])
def test_a_progress_lines_sink_rows_read_from_its_end_are_the_parsed_rows(line):
    from app.store_totals import progress_sink_rows

    parsed = parse_lines([line.encode()])
    assert progress_sink_rows(line.encode()) == ((parsed[0].get("sink_rows") or {}) if parsed else None)


def test_two_rows_glued_on_one_line_count_as_the_complete_one():
    from app.store_totals import progress_sink_rows

    assert progress_sink_rows(b'{"ts_ms": 1, "batch_id": 99{"ts_ms": 2, "sink_rows": {"enriched": 3}}') == {"enriched": 3}


def test_the_exporters_first_read_parses_only_each_rows_sink_rows(tmp_path, monkeypatch):
    """A progress row is ~4 KB; the totals need its ``sink_rows`` only, and parse only those bytes
    (a first read of 100,000 rows parsed whole took 12.9 s; bench/bench_metrics_readers.py)."""
    import app.store_totals as store_totals

    write_progress(tmp_path, range(40))
    parsed: list[int] = []
    real_loads = store_totals.json.loads
    monkeypatch.setattr(store_totals.json, "loads", lambda text: parsed.append(len(text)) or real_loads(text))
    totals = store_totals.RunningTotals(tmp_path).read()
    assert totals.batches == 40 and totals.enriched_rows == sum(b % 5 for b in range(40))
    assert len(parsed) == 40 and max(parsed) < 80, parsed  # {"enriched":3,"missing_state":1,"dead_letter":0}
