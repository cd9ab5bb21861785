"""The console's DuckDB queries against real files: each figure is checked against the same
files read independently (pyarrow for Parquet, json for the metrics store)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from app import console_math, metric_queries, queries, sources
from app_fixtures import (ENRICHED_SCHEMA, MISSING_SCHEMA, empty_data_dir, fixture_data,  # noqa: F401 - fixtures
                          read_metrics, read_sink)
from pipeline import store
from pipeline.sinks import DeltaSinks


@pytest.fixture(scope="module")
def connection():
    con = sources.connect()
    yield con
    con.close()


def _ms(series: pd.Series) -> pd.Series:
    return series.astype("datetime64[ms, UTC]").astype("int64")


# --------------------------------------------------------------------- empty data dir

EMPTY_CALLS = {
    "load_sink_totals": {"now_ms": 0},
    "load_sink_spans": {},
    "load_throughput": {"window_end_ms": 10_000, "window_s": 60, "bucket_s": 1},
    "load_latency": {"window_end_ms": 10_000, "window_s": 60, "bucket_s": 1},
    "load_newest_enriched": {},
    "load_missing_orders": {"user_id": 1},
    "load_missing_totals": {},
    "load_missing_by_reason": {"window_end_ms": 10_000, "window_s": 60, "bucket_s": 1},
    "load_top_missing_keys": {"window_end_ms": 10_000, "window_s": 60},
    "load_key_load": {"window_end_ms": 10_000, "window_s": 60},
    "load_recent_tasks": {},
    "load_partition_rows": {},
    "load_batches": {},
    "load_state_by_operator": {},
    "load_lookup_state": {},
    "load_backlog": {},
    "load_progress_totals": {},
    "load_topic_positions": {"topic": "users", "since_ms": 0},
    "load_events": {},
    "load_latest_lifecycle_event": {},
    "load_event_counts": {},
    "load_replays": {},
    "load_order_shares": {},
    "load_watermarks": {},
    "load_partition_watermarks": {},
}


@pytest.mark.parametrize("name", sorted(EMPTY_CALLS))
def test_every_query_reads_an_untouched_data_dir_as_empty(connection, empty_data_dir, name):
    module = queries if hasattr(queries, name) else metric_queries
    frame = getattr(module, name)(connection, empty_data_dir, **EMPTY_CALLS[name])
    assert isinstance(frame, pd.DataFrame)
    numbers = frame.select_dtypes("number").fillna(0)
    if name == "load_latency":
        assert frame["scope"].tolist() == ["window"] and frame["orders"].tolist() == [0]
    elif name == "load_progress_totals":
        assert numbers.to_numpy().sum() == 0  # one summary row of zeros
    elif name in ("load_sink_totals", "load_sink_spans"):
        assert frame["sink"].tolist() == ["enriched", "missing_state", "dead_letter"]
        assert numbers.to_numpy().sum() == 0  # one summary row of zeros
    else:
        assert frame.empty


def test_every_query_is_covered_by_the_empty_dir_test():
    public = {name for module in (queries, metric_queries) for name in dir(module)
              if name.startswith("load_") and getattr(getattr(module, name), "__module__", "") == module.__name__}
    assert public == set(EMPTY_CALLS)


# ------------------------------------------------------------------------------ sinks

def test_sink_totals_and_last_minute_rates(connection, fixture_data):
    data_dir, now = fixture_data.data_dir, fixture_data.now_ms
    totals = queries.load_sink_totals(connection, data_dir, now).set_index("sink")
    for sink, column in queries.SINK_TIME.items():
        frame = read_sink(data_dir, sink)
        times = _ms(frame[column])
        last_minute = int(((times > now - 60_000) & (times <= now)).sum())
        assert totals.at[sink, "rows"] == len(frame)
        assert totals.at[sink, "rows_last_minute"] == last_minute
        assert totals.at[sink, "rows_per_second"] == pytest.approx(last_minute / 60)
        assert totals.at[sink, "newest_ms"] == times.max()
        assert totals.at[sink, "oldest_ms"] == times.min()
    assert totals.at["enriched", "rows"] == fixture_data.enriched_rows > 0


def test_latency_percentiles_on_known_latencies(connection, tmp_path):
    # 100 orders published at t and enriched 1..100 ms later: p50 = 50.5, p99 = 99.01 (linear).
    base = 1_800_000_000_000
    latencies = np.arange(1, 101)
    columns = {field.name: pa.nulls(100, field.type) for field in ENRICHED_SCHEMA}
    columns.update(
        published_at=pa.array((base + 1000 - latencies) * 1000).cast(pa.timestamp("us", tz="UTC")),
        enriched_at=pa.array(np.full(100, (base + 1000) * 1000)).cast(pa.timestamp("us", tz="UTC")),
        invoice_id=pa.array(np.arange(100), pa.int64()),
    )
    DeltaSinks({"enriched": store.sink_dir(tmp_path, "enriched")}).commit_batch(
        {"enriched": pa.table(columns, schema=ENRICHED_SCHEMA)}, 0)
    latency = queries.load_latency(connection, tmp_path, window_end_ms=base + 1000, window_s=60, bucket_s=10)
    window, bucket = latency.iloc[0], latency.iloc[1]
    assert latency["scope"].tolist() == ["window", "bucket"] and pd.isna(window["bucket_start"])
    assert (window["orders"], window["p50_ms"], window["max_ms"]) == (100, 50.5, 100)
    assert window["p99_ms"] == pytest.approx(99.01)
    assert (bucket["orders"], bucket["p50_ms"]) == (100, 50.5)


def test_throughput_buckets_count_back_from_the_window_end(connection, fixture_data):
    data_dir = fixture_data.data_dir
    enriched = read_sink(data_dir, "enriched")
    end = int(_ms(enriched["enriched_at"]).max())
    throughput = queries.load_throughput(connection, data_dir, end, window_s=10, bucket_s=5)
    rows = throughput[throughput["sink"] == "enriched"]
    times = _ms(enriched["enriched_at"])
    expected = [int(((times > end - 10_000) & (times <= end - 5_000)).sum()), int(((times > end - 5_000) & (times <= end)).sum())]
    assert rows["rows"].tolist() == expected
    assert rows["rows_per_second"].tolist() == pytest.approx([count / 5 for count in expected])
    assert _ms(rows["bucket_start"].dt.tz_localize("UTC")).tolist() == [end - 10_000, end - 5_000]


def test_counts_are_exact_when_a_file_straddles_bucket_and_window_edges(connection, tmp_path):
    # The job stamps one commit time per batch, so the catalog counts whole files; an older or
    # foreign file may spread its rows, and then only that file is read. Both must add up.
    end, rng = 1_800_000_000_000, np.random.default_rng(3)
    spread = end - rng.integers(0, 130_000, 400)  # over two minutes: across the 60 s and every 5 s edge
    batches = {0: spread, 1: np.full(50, end - 7_000), 2: np.full(30, end - 200_000)}
    reasons = np.array(["user", "item", "user_and_item", None], dtype=object)
    for batch, times in batches.items():
        for sink, schema in (("enriched", ENRICHED_SCHEMA), ("missing_state", MISSING_SCHEMA)):
            columns = {field.name: pa.nulls(len(times), field.type) for field in schema}
            columns[queries.SINK_TIME[sink]] = pa.array(times * 1000).cast(pa.timestamp("us", tz="UTC"))
            if sink == "missing_state":
                columns["reason"] = pa.array(reasons[rng.integers(0, 3 if batch else 4, len(times))])
            DeltaSinks({sink: store.sink_dir(tmp_path, sink)}).commit_batch({sink: pa.table(columns, schema=schema)}, batch)
    enriched, missing = read_sink(tmp_path, "enriched"), read_sink(tmp_path, "missing_state")

    totals = queries.load_sink_totals(connection, tmp_path, end).set_index("sink")
    times = _ms(enriched["enriched_at"])
    assert totals.at["enriched", "rows_last_minute"] == int(((times > end - 60_000) & (times <= end)).sum())

    throughput = queries.load_throughput(connection, tmp_path, end, window_s=90, bucket_s=5)
    in_window = times[times > end - 90_000]
    expected = (end - ((end - in_window) // 5000 + 1) * 5000).value_counts().sort_index()
    rows = throughput[throughput["sink"] == "enriched"]
    assert _ms(rows["bucket_start"].dt.tz_localize("UTC")).tolist() == expected.index.tolist()
    assert rows["rows"].tolist() == expected.tolist()
    assert str(throughput["bucket_start"].dtype) == "datetime64[us]"

    by_reason = queries.load_missing_by_reason(connection, tmp_path, end, window_s=90, bucket_s=5)
    times = _ms(missing["detected_at"])
    picked = missing[(times > end - 90_000)].assign(bucket=end - ((end - times) // 5000 + 1) * 5000)
    expected = picked.fillna({"reason": "NULL"}).groupby(["bucket", "reason"]).size()
    got = by_reason.assign(bucket=_ms(by_reason["bucket_start"].dt.tz_localize("UTC"))).fillna({"reason": "NULL"})
    assert got.set_index(["bucket", "reason"])["orders"].to_dict() == expected.to_dict()
    assert got["bucket"].is_monotonic_increasing and by_reason["reason"].isna().any()


def test_newest_enriched_orders(connection, fixture_data):
    newest = queries.load_newest_enriched(connection, fixture_data.data_dir, limit=5)
    enriched = read_sink(fixture_data.data_dir, "enriched").sort_values(
        ["enriched_at", "invoice_id"], ascending=False).head(5)
    assert newest["invoice_id"].tolist() == enriched["invoice_id"].tolist()
    assert newest["latency_ms"].tolist() == (_ms(enriched["enriched_at"]) - _ms(enriched["published_at"])).tolist()


# ---------------------------------------------------------------------- missing state

def test_missing_orders_say_when_the_user_and_item_appeared(connection, fixture_data):
    data_dir = fixture_data.data_dir
    enriched, missing = read_sink(data_dir, "enriched"), read_sink(data_dir, "missing_state")
    found = queries.load_missing_orders(connection, data_dir, limit=1000)
    assert len(found) == len(missing)
    appeared = 0
    for row in found.itertuples():
        detected = pd.Timestamp(row.detected_at, tz="UTC")
        for key, seen in (("user_id", row.user_seen_at), ("item_id", row.item_seen_at)):
            later = enriched[(enriched[key] == getattr(row, key)) & (enriched["enriched_at"] > detected)]["enriched_at"]
            expected = later.min() if len(later) else None
            if expected is None:
                assert pd.isna(seen)
            else:
                appeared += 1
                assert pd.Timestamp(seen, tz="UTC") == expected
    assert appeared > 0  # the fixture has keys that show up later


def test_missing_orders_search_by_each_id(connection, fixture_data):
    data_dir, example = fixture_data.data_dir, fixture_data.missing_example
    missing = read_sink(data_dir, "missing_state")
    for column in ("invoice_id", "user_id", "item_id"):
        found = queries.load_missing_orders(connection, data_dir, **{column: example[column]})
        assert sorted(found["source_message_id"]) == sorted(missing[missing[column] == example[column]]["source_message_id"])
        assert not found.empty


def test_missing_orders_show_what_became_of_a_redrive(connection, fixture_data):
    data_dir = fixture_data.data_dir
    found = queries.load_missing_orders(connection, data_dir, limit=1000).set_index("source_message_id")
    redriven = fixture_data.redriven_message_ids
    assert redriven and found.loc[redriven, "redrive_enriched_at"].notna().all()
    assert found.drop(index=redriven)["redrive_enriched_at"].isna().all()


def test_missing_totals_reasons_over_time_and_top_keys(connection, fixture_data):
    data_dir = fixture_data.data_dir
    missing = read_sink(data_dir, "missing_state")
    totals = queries.load_missing_totals(connection, data_dir).set_index("reason")["orders"]
    assert totals.to_dict() == missing["reason"].value_counts().to_dict()
    end = int(_ms(missing["detected_at"]).max())
    by_reason = queries.load_missing_by_reason(connection, data_dir, end, window_s=3600, bucket_s=60)
    assert by_reason.groupby("reason")["orders"].sum().to_dict() == totals.to_dict()
    enriched = read_sink(data_dir, "enriched")
    for window_s in (3600, 8):  # all of the fixture, and only its newest seconds
        top = queries.load_top_missing_keys(connection, data_dir, window_end_ms=end, window_s=window_s, limit=3)
        in_window = missing[_ms(missing["detected_at"]) > end - window_s * 1000]
        assert 0 < len(in_window) and (window_s == 3600) == (len(in_window) == len(missing))
        for key, reasons in (("user", ["user", "user_and_item"]), ("item", ["item", "user_and_item"])):
            rows = top[top["key"] == key]
            counts = in_window[in_window["reason"].isin(reasons)].groupby(f"{key}_id")["detected_at"].agg(["count", "max"])
            assert rows["missing_orders"].tolist() == sorted(counts["count"], reverse=True)[:3]
            for row in rows.itertuples():
                assert counts.at[row.key_id, "count"] == row.missing_orders
                later = enriched[(enriched[f"{key}_id"] == row.key_id) & (enriched["enriched_at"] > counts.at[row.key_id, "max"])]
                expected = later["enriched_at"].min() if len(later) else None
                assert (pd.isna(row.seen_since_at) if expected is None else pd.Timestamp(row.seen_since_at, tz="UTC") == expected)


# ------------------------------------------------------------------------------ skew

def test_key_load_and_the_share_of_the_top_one_percent(connection, fixture_data):
    data_dir = fixture_data.data_dir
    enriched, missing = read_sink(data_dir, "enriched"), read_sink(data_dir, "missing_state")
    end = int(_ms(enriched["enriched_at"]).max())
    start = end - 20_000  # the newest 20 s of the fixture
    in_window = lambda frame, column: frame[(_ms(frame[column]) > start) & (_ms(frame[column]) <= end)]  # noqa: E731
    users = pd.concat([in_window(enriched, "enriched_at")["user_id"], in_window(missing, "detected_at")["user_id"]])
    counts = users.value_counts()
    top_keys = max(1, math.ceil(len(counts) * 0.01))
    assert 0 < len(users) < len(enriched) + len(missing)
    both = queries.load_key_load(connection, data_dir, window_end_ms=end, window_s=20, limit=5)
    assert set(both["key"]) == {"user", "item"}
    load = both[both["key"] == "user"]
    assert load["orders"].tolist() == counts.sort_values(ascending=False).head(5).tolist()
    first = load.iloc[0]
    assert (first["total_keys"], first["total_orders"], first["top_keys"]) == (len(counts), len(users), top_keys)
    assert first["top_share"] == pytest.approx(counts.sort_values(ascending=False).head(top_keys).sum() / len(users))


def test_recent_tasks_and_rows_per_partition(connection, fixture_data):
    data_dir = fixture_data.data_dir
    tasks = pd.DataFrame(read_metrics(data_dir, "tasks"))
    recent = metric_queries.load_recent_tasks(connection, data_dir, batches=2)
    newest = sorted(tasks["batch_id"].unique())[-2:]
    assert sorted(recent["batch_id"].unique()) == newest
    assert recent["records"].sum() == tasks[tasks["batch_id"].isin(newest)]["records"].sum()

    progress = read_metrics(data_dir, "progress")[-10:]
    expected: dict[tuple[str, int], int] = {}
    for row in progress:
        for topic in row["topics"]:
            for part in topic["partitions"]:
                key = (topic["topic"], part["partition"])
                expected[key] = expected.get(key, 0) + part["rows"]
    partitions = metric_queries.load_partition_rows(connection, data_dir, batches=10)
    assert {(r.topic, r.partition): r.rows for r in partitions.itertuples()} == expected


# --------------------------------------------------------------- progress and events

def test_batches_skip_the_half_written_line_and_sum_the_state(connection, fixture_data):
    data_dir = fixture_data.data_dir
    progress = read_metrics(data_dir, "progress")
    raw_lines = sum(len(p.read_text().splitlines()) for p in store.metrics_dir(data_dir, "progress").glob("*.jsonl"))
    assert raw_lines == len(progress) + 1  # the fixture ends in a half-written line
    batches = metric_queries.load_batches(connection, data_dir, limit=1000)
    assert batches["batch_id"].tolist() == [row["batch_id"] for row in progress]
    last, newest = batches.iloc[-1], progress[-1]
    assert last["state_rows"] == sum(op["rows_total"] for op in newest["state"])
    assert last["rocksdb_commit_ms"] == sum(value for op in newest["state"] for name, value in op["custom"].items()
                                            if name.startswith("rocksdbCommit") and "Latency" in name)
    assert last["rocksdb_commit_ms"] > 0
    assert last["addBatch_ms"] == newest["duration_ms"]["addBatch"]
    assert last["enriched_rows"] == newest["sink_rows"]["enriched"]
    totals = metric_queries.load_progress_totals(connection, data_dir).iloc[0]
    assert (totals["batches"], totals["enriched_rows"]) == (len(progress), fixture_data.enriched_rows)


def test_backlog_per_topic(connection, fixture_data):
    newest = read_metrics(fixture_data.data_dir, "progress")[-1]
    backlog = metric_queries.load_backlog(connection, fixture_data.data_dir, limit=1).set_index("topic")["backlog"]
    for topic in newest["topics"]:
        assert backlog[topic["topic"]] == console_math.compute_backlog(
            topic["end_position"], topic["latest_position"], topic["backlog"])


def test_events_replays_and_state_by_operator(connection, fixture_data):
    data_dir = fixture_data.data_dir
    events = read_metrics(data_dir, "events")
    loaded = metric_queries.load_events(connection, data_dir)
    assert loaded["kind"].tolist() == [e["kind"] for e in sorted(events, key=lambda e: e["ts_ms"], reverse=True)]
    assert loaded["details"].iloc[-1] == events[0]["details"]
    lifecycle = metric_queries.load_latest_lifecycle_event(connection, data_dir)
    assert lifecycle["kind"].tolist() == ["job_started"] and lifecycle["details"][0] == {"run_id": "run-2"}
    counts = metric_queries.load_event_counts(connection, data_dir).set_index("kind")["events"]
    assert counts["restart"] == 1 and counts["replay_started"] == 2

    replays = metric_queries.load_replays(connection, data_dir).set_index("seq")
    assert replays.loc[1, "messages"] == next(e["details"]["messages"] for e in events if e["kind"] == "replay_finished")
    assert replays.loc[1, "requested_by"] == "console" and replays.loc[2, "requested_by"] == "cli"
    assert pd.isna(replays.loc[2, "finished_at"]) and replays.loc[2, "from_position"] == "2026-11-21T00:00:00Z"

    newest = read_metrics(data_dir, "progress")[-1]
    operators = metric_queries.load_state_by_operator(connection, data_dir).set_index("operator")["rows_total"]
    assert operators.to_dict() == {op["operator"]: op["rows_total"] for op in newest["state"]}


def test_topic_positions_for_a_replay(connection, fixture_data):
    data_dir = fixture_data.data_dir
    started = next(e for e in read_metrics(data_dir, "events") if e["kind"] == "replay_started" and e["details"]["seq"] == 2)
    positions = metric_queries.load_topic_positions(connection, data_dir, topic="users", since_ms=started["ts_ms"])
    expected = [t["end_position"] for row in read_metrics(data_dir, "progress") if row["ts_ms"] >= started["ts_ms"]
                for t in row["topics"] if t["topic"] == "users"]
    assert positions["end_position"].tolist() == expected and expected
    progress = console_math.locate_replay(positions, None, generation=2)
    assert progress.start_position == 0 and progress.current_position == expected[-1]


def test_a_line_of_the_wrong_shape_is_skipped_not_fatal(connection, tmp_path):
    folder = store.metrics_dir(tmp_path, "events")
    folder.mkdir(parents=True)
    good = {"ts": "2026-11-22T00:00:00.000Z", "ts_ms": 1, "kind": "job_started", "message": "m", "details": {}}
    (folder / "2026-11-22.jsonl").write_text(json.dumps(good) + "\n" + '{"ts_ms": "not a number", "kind": 3}\n{"ts_ms": 2')
    assert metric_queries.load_events(connection, tmp_path)["kind"].tolist() == ["job_started"]


def test_lookup_state_is_the_newest_census_per_lookup(connection, tmp_path):
    from pipeline.metrics import MetricsStore

    metrics = MetricsStore(tmp_path)
    for batch, held in ((3, 10), (7, 12)):
        for lookup, waiting in (("users", 2), ("items", 0)):
            metrics.append("state", {"ts_ms": 1000 * batch, "batch_id": batch, "lookup": lookup, "state_rows": held + waiting,
                                     "keys_held": held, "waiting_keys": waiting, "waiting_orders": 3 * waiting})
    state = metric_queries.load_lookup_state(connection, tmp_path).set_index("lookup")
    assert state.loc["users", ["batch_id", "keys_held", "waiting_keys", "waiting_orders"]].tolist() == [7, 12, 2, 6]
    assert state.loc["items", ["keys_held", "waiting_orders"]].tolist() == [12, 0]


# ------------------------------------------------------------ admission: changelogs first

def test_batches_and_backlog_carry_what_the_planner_admitted(connection, fixture_data):
    progress = read_metrics(fixture_data.data_dir, "progress")
    batches = metric_queries.load_batches(connection, fixture_data.data_dir, limit=1000)
    assert batches["orders_held"].tolist() == [row["orders_held"] for row in progress]
    assert batches["orders_shared"].tolist() == [row["orders_shared"] for row in progress]
    assert batches["orders_held_for"].tolist() == [row["orders_held_for"] for row in progress]
    assert batches["orders_rows"].tolist() == [t["rows"] for row in progress for t in row["topics"] if t["topic"] == "orders"]
    assert batches["orders_held"].sum() == 1 and batches["orders_shared"].sum() == 2
    backlog = metric_queries.load_backlog(connection, fixture_data.data_dir, limit=1000)
    expected = {(row["batch_id"], t["topic"]): (t["admitted_messages"], t["admitted_bytes"])
                for row in progress for t in row["topics"]}
    assert {(r.batch_id, r.topic): (r.admitted_messages, r.admitted_bytes) for r in backlog.itertuples()} == expected


def test_order_shares_come_from_their_events(connection, fixture_data):
    shares = metric_queries.load_order_shares(connection, fixture_data.data_dir)
    ended = next(e for e in read_metrics(fixture_data.data_dir, "events") if e["kind"] == "orders_share_ended")["details"]
    assert len(shares) == 1 and not shares["open"].iloc[0]
    run = shares.iloc[0]
    assert (run["started_batch"], run["last_batch"], run["batches"], run["held_for"], run["orders"]) == (
        ended["started_batch"], ended["last_batch"], 2, 3, fixture_data.shared_orders)
    assert fixture_data.shared_orders > 0 and not pd.isna(run["ended_at"])


def planner_row(batch_id: int, ts_ms: int, held_for: int | None, shared: bool, orders: int | None) -> dict:
    """A progress row as pipeline/metrics.py writes it; ``held_for`` None: one from before the planner said."""
    topics = [{"topic": "users", "generation": 0, "rows": 900, "end_position": batch_id, "latest_position": batch_id,
               "backlog": 0, "partitions": [{"partition": -1, "rows": 900}]},
              {"topic": "orders", "generation": 0, "rows": orders, "end_position": batch_id,
               "latest_position": batch_id, "backlog": 0, "partitions": [{"partition": -1, "rows": orders}]}]
    row = {"ts_ms": ts_ms, "batch_id": batch_id, "topics": topics}
    if held_for is not None:
        for topic, messages in zip(topics, (1000, orders)):
            topic.update(admitted_messages=messages, admitted_bytes=None if messages is None else messages * 200)
        row.update(orders_held=held_for > 0 and not shared, orders_shared=held_for > 0 and shared, orders_held_for=held_for)
    return row


def test_an_open_share_counts_its_orders_so_far_once_each_and_old_rows_read_as_unknown(connection, tmp_path):
    from pipeline.listener import decide_order_share
    from pipeline.metrics import MetricsStore

    metrics = MetricsStore(tmp_path)
    rows = [planner_row(0, 1_000, None, False, 5), planner_row(1, 2_000, 1, False, 0),
            planner_row(2, 3_000, 2, True, 30), planner_row(3, 4_000, 3, True, 20)]
    share = None
    for row in rows + [planner_row(3, 5_000, 3, True, 20)]:  # batch 3 ran twice (a restore)
        metrics.append("progress", row)
        share, event = decide_order_share(share, row)
        if event:  # the listener records it after the batch's progress row
            kind, message, details = event
            metrics.append("events", {"ts_ms": row["ts_ms"] + 100, "kind": kind, "message": message, "details": details})
    shares = metric_queries.load_order_shares(connection, tmp_path)
    assert shares[["started_batch", "last_batch", "batches", "held_for", "orders", "open"]].values.tolist() == [
        [2, 3, 2, 3, 50, True]]
    assert pd.isna(shares["ended_at"].iloc[0])
    batches = metric_queries.load_batches(connection, tmp_path)
    assert batches["orders_held"].isna().tolist() == [True, False, False, False, False]
    assert batches["orders_rows"].tolist() == [5, 0, 30, 20, 20]
    old = metric_queries.load_backlog(connection, tmp_path).query("batch_id == 0")
    assert old["admitted_messages"].isna().all() and old["admitted_bytes"].isna().all()


def test_the_heartbeat_the_listener_writes_is_read_back_and_a_bad_one_is_none(tmp_path):
    from pipeline.listener import write_heartbeat

    assert metric_queries.read_heartbeat(tmp_path) is None
    write_heartbeat(tmp_path, 1_700_000_000_123)
    assert metric_queries.read_heartbeat(tmp_path) == 1_700_000_000_123
    store.heartbeat_path(tmp_path).write_text("{not json")
    assert metric_queries.read_heartbeat(tmp_path) is None
