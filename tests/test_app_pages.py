"""Every console page in Streamlit's AppTest: on an untouched data dir (a helpful empty state,
no exception) and on the fixture data dir (the figures shown equal DuckDB over the same files),
plus the control actions: nothing happens before confirmation, and the admin token is enforced."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pandas as pd
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from app import console_math
from app.views import format_bytes, format_count, format_ms
from app_fixtures import empty_data_dir, fixture_data, read_metrics  # noqa: F401 - fixtures
from pipeline import control as REAL_CONTROL
from pipeline import store
from pipeline.config import load_settings
from pipeline.errors import ControlError

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "tok-3f9a-never-shown"


@dataclass
class FakeSavepoint:
    name: str
    batch_id: int
    taken_at: str
    size_bytes: int
    path: str


class FakeControl(types.ModuleType):
    """Stands in for pipeline.control and records every call made to it."""

    def __init__(self):
        super().__init__("pipeline.control")
        self.calls: list[tuple[str, tuple, dict]] = []
        self.savepoints = [FakeSavepoint("before-replay", 15, "2026-11-22T01:00:00Z", 183_500, "/x")]
        self.fail_with: Exception | None = None

    def _record(self, name, *args, **kwargs):
        self.calls.append((name, args, kwargs))
        if self.fail_with:
            raise self.fail_with

    def inspect_state(self, settings, keys, client="cli"):
        self._record("inspect_state", keys=keys, client=client)
        return [{"lookup": lookup, "key": key, "batch_id": 7,
                 "latest": {"user_first_name": "Ada", "user_email": "ada@example.com"} if lookup == "users" else None,
                 "waiting": [] if lookup == "users" else [{"invoice_id": 5, "source_message_id": "1:2:-1:-1"}]}
                for lookup, key in keys]

    def plan_redrive(self, settings, invoice_ids=None, user_id=None, item_id=None, reason=None):
        return REAL_CONTROL.plan_redrive(settings, invoice_ids, user_id, item_id, reason)  # reads only

    def redrive(self, settings, invoice_ids=None, user_id=None, item_id=None, reason=None, requested_by="console"):
        self._record("redrive", invoice_ids=invoice_ids, requested_by=requested_by)
        return REAL_CONTROL.RedrivePlan(rows=[{"invoice_id": i} for i in invoice_ids or []])

    def request_replay(self, settings, topic, from_time=None, requested_by="console"):
        self._record("request_replay", topic, from_time=from_time, requested_by=requested_by)
        return {"seq": 3, "topic": topic, "from": from_time or "earliest", "requested_at": "now", "requested_by": requested_by}

    def list_savepoints(self, settings):
        return list(self.savepoints)

    def take_savepoint(self, settings, name=None):
        self._record("take_savepoint", name)
        return FakeSavepoint(name or "2026-11-22T01-02-03", 29, "2026-11-22T01:02:03Z", 70_000, "/y")

    def restore_savepoint(self, settings, name):
        self._record("restore_savepoint", name)
        return self.savepoints[0]


@pytest.fixture
def control(monkeypatch) -> FakeControl:
    fake = FakeControl()
    monkeypatch.setitem(sys.modules, "pipeline.control", fake)
    return fake


@pytest.fixture
def open_page(monkeypatch):
    """``open_page(file, data_dir, **env)``: a page run once in AppTest with fresh caches."""

    def open_(page: str, data_dir: Path, **env: str) -> AppTest:
        for name in [name for name in list(__import__("os").environ) if name.startswith("SS_")]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("SS_PATHS_DATA_DIR", str(data_dir))
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        st.cache_resource.clear()
        st.cache_data.clear()
        app = AppTest.from_file(str(ROOT / "pages" / page), default_timeout=30).run()
        assert not app.exception, [e.value for e in app.exception]
        return app

    yield open_
    st.cache_resource.clear()
    st.cache_data.clear()


def _sql(sql: str, **params):
    return duckdb.execute(sql, params).fetchall()


def _count(data_dir: Path, sink: str, where: str = "true") -> int:
    return _sql(f"SELECT count(*) FROM read_parquet('{store.sink_glob(data_dir, sink)}') WHERE {where}")[0][0]


def _metrics(app: AppTest) -> dict[str, str]:
    return {metric.label: metric.value for metric in app.metric}


def _texts(elements) -> str:
    return " | ".join(str(element.value) for element in elements)


# ------------------------------------------------------------------------- empty states

@pytest.mark.parametrize(("page", "expected"), [
    ("live_enrichment.py", "No enriched orders yet — start the job with `make demo` or `python -m pipeline run`."),
    ("missing_state.py", "No missing-state orders yet."),
    ("data_skew.py", "No orders yet, so no keys to rank"),
    ("backpressure.py", "No micro-batches recorded yet"),
    ("checkpoints.py", "No committed batches yet"),
    ("replay.py", "No replays yet — request one above"),
    ("storage.py", "Nothing on disk yet"),
])
def test_each_page_explains_what_to_do_on_an_empty_data_dir(open_page, empty_data_dir, control, page, expected):
    app = open_page(page, empty_data_dir)
    assert expected in _texts(app.info)
    assert not app.error


def test_live_page_on_an_empty_dir_says_the_job_has_not_started(open_page, empty_data_dir):
    app = open_page("live_enrichment.py", empty_data_dir)
    assert "Job: Not started" in _texts(app.info)


def test_a_bad_setting_is_shown_as_one_line_not_a_traceback(open_page, empty_data_dir):
    app = open_page("live_enrichment.py", empty_data_dir, SS_JOB_TRIGGER_INTERVAL="soon")
    assert "job.trigger_interval" in _texts(app.error)
    assert not app.metric


# ----------------------------------------------------------------------- with data

def test_live_page_figures_match_the_sinks(open_page, fixture_data):
    data_dir = fixture_data.data_dir
    app = open_page("live_enrichment.py", data_dir)
    shown = _metrics(app)
    assert shown["Enriched orders"] == format_count(_count(data_dir, "enriched"))
    assert shown["Missing state"] == format_count(_count(data_dir, "missing_state"))
    assert shown["Dead letters"] == format_count(_count(data_dir, "dead_letter"))
    glob = store.sink_glob(data_dir, "enriched")
    (p50, p99), = _sql(f"""
        WITH src AS (SELECT epoch_ms(enriched_at) AS e, epoch_ms(enriched_at) - epoch_ms(published_at) AS l
                     FROM read_parquet('{glob}')),
             newest AS (SELECT max(e) AS m FROM src)
        SELECT quantile_cont(l, 0.5), quantile_cont(l, 0.99) FROM src, newest WHERE e > m - 300000""")
    assert shown["Latency p50"] == format_ms(p50) and shown["Latency p99"] == format_ms(p99)
    newest = [row[0] for row in _sql(f"SELECT invoice_id FROM read_parquet('{glob}') "
                                     "ORDER BY enriched_at DESC, invoice_id DESC LIMIT 20")]
    assert app.dataframe[0].value["invoice_id"].tolist() == newest
    assert len(app.get("plotly_chart")) == 2
    assert "Job:" in _texts(app.warning) + _texts(app.success)


def test_missing_state_page_counts_reasons_and_searches(open_page, fixture_data):
    data_dir = fixture_data.data_dir
    app = open_page("missing_state.py", data_dir)
    shown = _metrics(app)
    assert shown["Missing orders"] == format_count(_count(data_dir, "missing_state"))
    assert shown["User missing"] == format_count(_count(data_dir, "missing_state", "reason = 'user'"))
    assert shown["Both missing"] == format_count(_count(data_dir, "missing_state", "reason = 'user_and_item'"))
    user_id = fixture_data.missing_example["user_id"]
    app.selectbox(key="search_kind").select("user id").run()
    app.text_input(key="search_id").input(str(user_id)).run()
    orders = app.dataframe[-1].value
    assert len(orders) == _count(data_dir, "missing_state", f"user_id = {user_id}")
    assert set(orders["user_id"]) == {user_id}
    assert orders["why"].str.contains(str(user_id)).any()


def test_missing_state_search_rejects_a_non_numeric_id(open_page, fixture_data):
    app = open_page("missing_state.py", fixture_data.data_dir)
    app.text_input(key="search_id").input("abc").run()
    assert "'abc' is not a whole number" in _texts(app.error)


def test_redrive_asks_for_confirmation_before_acting(open_page, fixture_data, control):
    app = open_page("missing_state.py", fixture_data.data_dir)
    invoice = fixture_data.missing_example["invoice_id"]
    app.multiselect(key="redrive_invoices").select(invoice).run()
    app.button(key="redrive_ask").click().run()
    assert "Please confirm:" in _texts(app.warning) and str(invoice) in _texts(app.warning)
    assert control.calls == []
    app.button(key="redrive_do").click().run()  # not ticked
    assert "Tick" in _texts(app.error) and control.calls == []
    app.checkbox(key="redrive_confirm").check().run()
    app.button(key="redrive_do").click().run()
    assert control.calls == [("redrive", (), {"invoice_ids": [invoice], "requested_by": "console"})]
    assert "Re-drove 1 missing-state order line(s)" in _texts(app.success)


def test_redrive_shows_what_it_will_do_before_the_confirmation(open_page, fixture_data, control):
    """The plan over the real sinks: a row re-driven already is skipped, and said so, before anything is sent."""
    data_dir = fixture_data.data_dir
    redriven = fixture_data.redriven_message_ids[0]
    (invoice,), = _sql(f"SELECT invoice_id FROM read_parquet('{store.sink_glob(data_dir, 'missing_state')}') "
                       "WHERE source_message_id = $m", m=redriven)
    (fresh,), = _sql(f"SELECT min(invoice_id) FROM read_parquet('{store.sink_glob(data_dir, 'missing_state')}') "
                     "WHERE NOT list_contains($ids, source_message_id)", ids=fixture_data.redriven_message_ids)
    app = open_page("missing_state.py", data_dir)
    app.multiselect(key="redrive_invoices").select(invoice).select(fresh).run()
    app.button(key="redrive_ask").click().run()
    plan = REAL_CONTROL.plan_redrive(load_settings(env={}, cli={"paths.data_dir": str(data_dir)}), invoice_ids=[invoice, fresh])
    assert plan.skipped == {REAL_CONTROL.SKIP_REDRIVEN: 1} and plan.count == 1
    assert plan.describe() in _texts(app.warning)
    assert "1 order line(s) will be republished; 1 skipped: 1 already re-driven" in _texts(app.warning)
    assert control.calls == []


def test_control_actions_need_the_admin_token_when_one_is_set(open_page, fixture_data, control):
    app = open_page("missing_state.py", fixture_data.data_dir, SS_APP_ADMIN_TOKEN=TOKEN)
    app.multiselect(key="redrive_invoices").select(fixture_data.missing_example["invoice_id"]).run()
    app.button(key="redrive_ask").click().run()
    app.checkbox(key="redrive_confirm").check().run()
    app.text_input(key="redrive_token").input("wrong").run()
    app.button(key="redrive_do").click().run()
    assert "admin token is not right" in _texts(app.error) and control.calls == []
    app.text_input(key="redrive_token").input(TOKEN).run()
    app.button(key="redrive_do").click().run()
    assert [call[0] for call in control.calls] == ["redrive"]
    shown = " ".join(_texts(elements) for elements in (app.markdown, app.success, app.error, app.warning, app.info, app.caption))
    assert TOKEN not in shown


def test_a_control_error_is_shown_as_one_line(open_page, fixture_data, control):
    control.fail_with = ControlError("the job is running; stop it before restoring a savepoint")
    app = open_page("checkpoints.py", fixture_data.data_dir)
    app.selectbox(key="restore_name").select("before-replay").run()
    app.button(key="restore_savepoint_ask").click().run()
    app.checkbox(key="restore_savepoint_confirm").check().run()
    app.button(key="restore_savepoint_do").click().run()
    assert "the job is running; stop it before restoring a savepoint" in _texts(app.error)
    assert not app.exception


def test_data_skew_page_figures(open_page, fixture_data):
    data_dir = fixture_data.data_dir
    app = open_page("data_skew.py", data_dir)
    shown = _metrics(app)
    users = f"""SELECT user_id FROM read_parquet('{store.sink_glob(data_dir, "enriched")}')
                UNION ALL SELECT user_id FROM read_parquet('{store.sink_glob(data_dir, "missing_state")}')"""
    (share,), = _sql(f"""
        WITH counts AS (SELECT user_id, count(*) AS n FROM ({users}) GROUP BY 1),
             ranked AS (SELECT n, row_number() OVER (ORDER BY n DESC, user_id) AS r, count(*) OVER () AS keys,
                               sum(n) OVER () AS total FROM counts)
        SELECT sum(n) FILTER (WHERE r <= greatest(1, ceil(keys * 0.01))) / any_value(total) FROM ranked""")
    assert shown["Share of orders on the top 1 % of users"] == f"{share:.1%}"
    tasks = read_metrics(data_dir, "tasks")
    latest = max(row["batch_id"] for row in tasks)
    for stage in ("user_lookup", "item_lookup"):
        records = [row["records"] for row in tasks if row["batch_id"] == latest and row["stage"] == stage]
        assert shown[f"Skew of {stage}"] == f"{console_math.compute_skew_percent(records):.0f} %"
    assert len(app.get("plotly_chart")) == 8


def test_backpressure_page_levels(open_page, fixture_data):
    app = open_page("backpressure.py", fixture_data.data_dir)
    progress = read_metrics(fixture_data.data_dir, "progress")
    levels = [console_math.classify_backpressure(console_math.compute_backpressure_ratio(
        row["batch_duration_ms"], row["trigger_interval_ms"])) for row in progress]
    shown = _metrics(app)
    assert shown["HIGH / LOW batches"] == f"{levels.count('HIGH')} / {levels.count('LOW')}"
    assert shown["Latest batch"].startswith(levels[-1])
    assert shown["Orders backlog"] == format_count(next(t["backlog"] for t in progress[-1]["topics"] if t["topic"] == "orders"))
    table = app.dataframe[0].value
    assert table["batch_id"].tolist() == [row["batch_id"] for row in progress][::-1][:30]
    assert "Backpressure ratio of a batch" in _texts(app.info)


def test_backpressure_page_shows_what_each_batch_admitted_and_the_orders_shared(open_page, fixture_data):
    app = open_page("backpressure.py", fixture_data.data_dir)
    progress = read_metrics(fixture_data.data_dir, "progress")
    shown = _metrics(app)
    assert shown["Orders in the newest batch"] == "admitted"
    assert shown["Batches that held orders back"] == f"{sum(row['orders_held'] for row in progress)} / {len(progress)}" == "1 / 30"
    assert shown["Orders admitted while the changelogs filled the cap"] == format_count(fixture_data.shared_orders)
    table = app.dataframe[0].value.set_index("batch_id")
    for row in progress[-30:]:
        expected = console_math.describe_orders_admission(row["orders_held"], row["orders_shared"], row["orders_held_for"])
        assert table.loc[row["batch_id"], "orders_admission"] == expected
    held = next(row for row in progress if row["orders_held"])
    assert table.loc[held["batch_id"], "orders_admission"] == "held back (1 in a row)"
    assert table.loc[held["batch_id"], "orders_rows"] == 0
    runs = app.dataframe[1].value
    assert runs[["batches", "held_for", "orders"]].values.tolist() == [[2, 3, fixture_data.shared_orders]]
    charts = {chart.proto.spec for chart in app.get("plotly_chart")}
    for title in ("Messages admitted per batch (estimated)", "Bytes admitted per batch (estimated)"):
        assert any(title in spec for spec in charts), title
    messages = next(__import__("json").loads(spec) for spec in charts if "Messages admitted per batch" in spec)
    newest = {trace["name"]: trace["y"] for trace in messages["data"]}
    assert {topic: _plotly_values(ys)[-1] for topic, ys in newest.items()} == {
        t["topic"]: t["admitted_messages"] for t in progress[-1]["topics"]}
    assert "Changelogs first" in _texts(app.caption)


def _plotly_values(values) -> list:
    """A plotly trace's values, whether plain or as plotly's typed-array encoding."""
    if isinstance(values, dict) and "bdata" in values:
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).tolist()
    return list(values)


def test_backpressure_page_reads_progress_rows_from_before_the_planner_said(open_page, fixture_data, tmp_path):
    """Rows without the admission fields (an older job): no admission figures, nothing invented."""
    import json

    data_dir = tmp_path / "data"
    folder = store.metrics_dir(data_dir, "progress")
    folder.mkdir(parents=True)
    old = []
    for row in read_metrics(fixture_data.data_dir, "progress"):
        row = {k: v for k, v in row.items() if not k.startswith("orders_")}
        row["topics"] = [{k: v for k, v in t.items() if not k.startswith("admitted_")} for t in row["topics"]]
        old.append(json.dumps(row))
    (folder / "2026-11-22.jsonl").write_text("\n".join(old) + "\n")
    app = open_page("backpressure.py", data_dir)
    shown = _metrics(app)
    assert shown["Orders in the newest batch"] == "–"
    assert shown["Batches that held orders back"] == "0 / 30"
    assert shown["Orders admitted while the changelogs filled the cap"] == "0"
    assert set(app.dataframe[0].value["orders_admission"]) == {"–"}
    assert len(app.dataframe) == 1  # no share runs
    assert "No batch recorded what its planner admitted yet" in _texts(app.caption)


@pytest.mark.e2e
def test_checkpoints_page_history_restarts_and_savepoints(open_page, fixture_data, control):
    app = open_page("checkpoints.py", fixture_data.data_dir)
    progress = read_metrics(fixture_data.data_dir, "progress")
    shown = _metrics(app)
    assert shown["Last batch"] == format_count(progress[-1]["batch_id"])
    assert shown["Restarts"] == "1"
    history, events, savepoints = (frame.value for frame in app.dataframe)
    assert history["batch_id"].tolist() == [row["batch_id"] for row in progress][::-1]
    assert history["addBatch_ms"].iloc[0] == progress[-1]["duration_ms"]["addBatch"]
    assert {"restart", "savepoint_taken", "job_started"} <= set(events["kind"])
    assert savepoints["name"].tolist() == ["before-replay"]
    app.text_input(key="savepoint_name").input("demo").run()
    app.button(key="take_savepoint_ask").click().run()
    assert control.calls == []
    app.checkbox(key="take_savepoint_confirm").check().run()
    app.button(key="take_savepoint_do").click().run()
    assert control.calls == [("take_savepoint", ("demo",), {})]
    assert "Savepoint 'demo' taken at batch 29" in _texts(app.success)


def test_storage_page_shows_each_part_and_when_maintenance_last_ran(open_page, fixture_data, tmp_path):
    import shutil

    from app.storage import list_files
    from pipeline.metrics import MetricsStore
    from pipeline.sinks import sink_files

    data_dir = Path(shutil.copytree(fixture_data.data_dir, tmp_path / "data"))  # the shared fixture stays as it is
    (store.checkpoint_dir(data_dir) / "offsets").mkdir(parents=True, exist_ok=True)
    (store.checkpoint_dir(data_dir) / "offsets" / "29").write_bytes(b"x" * 2048)
    MetricsStore(data_dir).event("sinks_maintained", "sinks compacted (3 files into 1) and vacuumed (0 files) in 0.1s",
                                 sinks={"enriched": {"files_removed": 3, "files_added": 1, "files_vacuumed": 0}})
    app = open_page("storage.py", data_dir)
    shown = _metrics(app)
    on_disk = list_files(data_dir)
    assert shown["Data dir"] == format_bytes(sum(size for _, size in on_disk))
    assert shown["Checkpoint"] == format_bytes(2048)
    parts, rounds = (frame.value for frame in app.dataframe)
    parts = parts.set_index("part")
    for sink in store.SINKS:
        assert parts.loc[f"sink {sink}", "live_files"] == len(sink_files(data_dir, sink))
    assert parts.loc["metrics progress", "files"] == len(list(store.metrics_dir(data_dir, "progress").glob("*.jsonl")))
    rounds = rounds.set_index("task")
    assert rounds.loc["compaction", "change"] == "3 files into 1" and pd.notna(rounds.loc["compaction", "last_run"])
    assert pd.isna(rounds.loc["vacuum", "last_change"])


def test_replay_page_progress_history_and_request(open_page, fixture_data, control):
    app = open_page("replay.py", fixture_data.data_dir)
    progress_text = app.get("progress")[0].proto.text
    users_rows = [t for row in read_metrics(fixture_data.data_dir, "progress") for t in row["topics"]
                  if t["topic"] == "users" and t["generation"] == 2]
    assert f"{users_rows[-1]['end_position']:,} of {users_rows[-1]['latest_position']:,} broker entries" in progress_text
    assert f"{sum(t['rows'] for t in users_rows):,} messages so far" in progress_text
    history = app.dataframe[0].value
    assert history["seq"].tolist() == [2, 1] and history["messages"].iloc[1] > 0
    app.radio(key="replay_topic").set_value("items").run()
    app.radio(key="replay_start").set_value("a chosen time (UTC)").run()
    app.button(key="replay_ask").click().run()
    assert "Please confirm:" in _texts(app.warning) and control.calls == []
    app.checkbox(key="replay_confirm").check().run()
    app.button(key="replay_do").click().run()
    (name, args, kwargs), = control.calls
    assert (name, args, kwargs["requested_by"]) == ("request_replay", ("items",), "console")
    assert kwargs["from_time"].endswith("T00:00:00Z")
    assert "Replay #3 of items requested" in _texts(app.success)


def test_the_entry_point_routes_to_every_page(monkeypatch, fixture_data, control):
    monkeypatch.setenv("SS_PATHS_DATA_DIR", str(fixture_data.data_dir))
    st.cache_resource.clear()
    app = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=30).run()
    assert app.title[0].value == "Live enrichment"
    for page, title in (("backpressure.py", "Backpressure"), ("data_skew.py", "Data skew"),
                        ("checkpoints.py", "Checkpoints & savepoints"), ("missing_state.py", "Missing state"),
                        ("replay.py", "Replay")):
        app.switch_page(f"../pages/{page}").run()
        assert not app.exception
        assert app.title[0].value == title


def test_missing_state_page_looks_up_what_the_job_holds_through_control(open_page, fixture_data, control):
    app = open_page("missing_state.py", fixture_data.data_dir)
    label = app.selectbox(key="state_order").options[0]
    user_id, item_id = (int(part.split()[1]) for part in label.split(" · ")[1:])
    app.button(key="state_lookup_ask").click().run()
    assert control.calls == [] and f"user {user_id} and item {item_id}" in _texts(app.warning)
    app.checkbox(key="state_lookup_confirm").check().run()
    app.button(key="state_lookup_do").click().run()
    assert not app.exception
    assert control.calls[-1] == ("inspect_state", (), {"keys": [("users", user_id), ("items", item_id)],
                                                       "client": "loopback"})
    shown = [block.value for block in app.markdown]
    assert f"**User {user_id}** (batch 7)" in shown and f"**Item {item_id}** (batch 7)" in shown
    assert any("Nothing held" in info.value for info in app.info)


def test_backpressure_page_shows_partition_watermarks_and_late_versions(open_page, fixture_data, tmp_path):
    """Event time: the topics' watermarks (a topic's the least of its partitions'), the partitions
    of a partitioned changelog with the idle one marked, and the late versions summed over batches."""
    import shutil

    from pipeline.enrich.event_clock import EventClockListener
    from pipeline.metrics import MetricsStore
    from test_event_clock import partitioned_progress

    data_dir = tmp_path / "data"
    shutil.copytree(store.metrics_dir(fixture_data.data_dir, "progress"), store.metrics_dir(data_dir, "progress"))
    clock = EventClockListener(MetricsStore(data_dir), data_dir, out_of_orderness_ms=1_000, idle_timeout_ms=3_000)
    clock.observe(partitioned_progress(0, 0, {0: 3, 1: 2}, {"users/0": 20_000, "users/1": 6_000, "items": 30_000},
                                       late={"users": 2, "items": 1}))
    clock.observe(partitioned_progress(1, 2, {0: 5, 1: 2}, {"users/0": 22_000}, late={"users": 1, "items": 0}))
    clock.observe(partitioned_progress(2, 3, {0: 6, 1: 2}, {"users/0": 23_000}))
    app = open_page("backpressure.py", data_dir)
    topics, partitions = app.dataframe[0].value, app.dataframe[1].value
    users = topics.set_index("topic").loc["users"]
    assert users["late_versions"] == 3 and users["idle"] == "" and str(users["watermark"]) == "1970-01-01 00:00:22"
    assert topics.set_index("topic").loc["items", "late_versions"] == 1
    assert partitions[["topic", "partition", "idle"]].values.tolist() == [["users", 0, ""], ["users", 1, "idle"]]
    assert "Idle (no longer holding the watermark back): users partition 1." in _texts(app.caption)


def test_the_state_lookup_needs_the_admin_token_and_a_confirmation(open_page, fixture_data, control):
    """Issue 27: each look-up starts (or queues for) a Spark worker, so it is a control action."""
    app = open_page("missing_state.py", fixture_data.data_dir, SS_APP_ADMIN_TOKEN=TOKEN)
    app.button(key="state_lookup_ask").click().run()
    app.button(key="state_lookup_do").click().run()
    assert "Tick" in _texts(app.error) and control.calls == []
    app.checkbox(key="state_lookup_confirm").check().run()
    app.text_input(key="state_lookup_token").input("wrong").run()
    app.button(key="state_lookup_do").click().run()
    assert "admin token is not right" in _texts(app.error) and control.calls == []
    app.text_input(key="state_lookup_token").input(TOKEN).run()
    app.button(key="state_lookup_do").click().run()
    assert [call[0] for call in control.calls] == ["inspect_state"]


def test_off_loopback_personal_fields_are_masked_until_the_token_is_given(open_page, fixture_data, control):
    data_dir = fixture_data.data_dir
    public = {"SS_APP_ADDRESS": "0.0.0.0", "SS_APP_ADMIN_TOKEN": TOKEN}
    emails = {row[0] for row in _sql(f"SELECT user_email FROM read_parquet('{store.sink_glob(data_dir, 'enriched')}')")}
    app = open_page("live_enrichment.py", data_dir, **public)
    newest = app.dataframe[-1].value
    assert set(newest["user_email"]) == {console_math.MASK} and set(newest["user_name"]) == {console_math.MASK}
    assert newest["invoice_id"].notna().all()  # the rest is shown
    app.sidebar.text_input(key="personal_token").input("wrong").run()
    app.sidebar.button(key="personal_unlock").click().run()
    assert set(app.dataframe[-1].value["user_email"]) == {console_math.MASK}
    app.sidebar.text_input(key="personal_token").input(TOKEN).run()
    app.sidebar.button(key="personal_unlock").click().run()
    assert set(app.dataframe[-1].value["user_email"]) <= emails and console_math.MASK not in set(app.dataframe[-1].value["user_email"])
    # the state look-up's latest version too
    app = open_page("missing_state.py", data_dir, **public)
    app.button(key="state_lookup_ask").click().run()
    app.checkbox(key="state_lookup_confirm").check().run()
    app.text_input(key="state_lookup_token").input(TOKEN).run()
    app.button(key="state_lookup_do").click().run()
    latest = next(frame.value for frame in app.dataframe if "latest version" in frame.value.columns)
    assert set(latest["latest version"]) == {console_math.MASK}
    # on loopback nothing is masked
    app = open_page("live_enrichment.py", data_dir, SS_APP_ADMIN_TOKEN=TOKEN)
    assert console_math.MASK not in set(app.dataframe[-1].value["user_email"])


@pytest.mark.parametrize("column,personal", [("user_email", True), ("user_first_name", True), ("user_name", True),
                                             ("payload", True), ("emailAddress", True), ("firstName", True),
                                             ("item_name", False), ("user_id", False), ("key", False), ("error", False)])
def test_which_columns_are_personal(column, personal):
    assert console_math.is_personal_column(column) is personal
