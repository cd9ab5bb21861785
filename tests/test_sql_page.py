"""The SQL pipelines page in AppTest: a helpful empty state, and figures equal to DuckDB over real files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import streamlit as st
from streamlit.testing.v1 import AppTest

from pipeline import store
from pipeline.sql.plan import build_plan
from pipeline.sql.runner import PIPELINE_FILE, describe_pipeline
from pipeline.sql.sink import SqlSinkWriter, build_result
from sqlhelp import COUNT_SQL

ROOT = Path(__file__).resolve().parent.parent


def open_page(monkeypatch, data_dir: Path) -> AppTest:
    for name in [name for name in __import__("os").environ if name.startswith("SS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SS_PATHS_DATA_DIR", str(data_dir))
    st.cache_resource.clear()
    st.cache_data.clear()
    app = AppTest.from_file(str(ROOT / "pages" / "sql_pipelines.py"), default_timeout=30).run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def test_the_page_says_how_to_start_a_pipeline_when_there_is_none(monkeypatch, tmp_path):
    app = open_page(monkeypatch, tmp_path)
    assert "No SQL pipelines yet" in " ".join(str(i.value) for i in app.info)
    assert app.title[0].value == "SQL pipelines"


def write_batch(writer: SqlSinkWriter, plan, batch_id: int, ops: list[str], accounts: list[str], counts: list) -> None:
    rows = pa.table({"op": ops, "key": [None] * len(ops), "s0_accountId": accounts, "agg1": counts})
    writer.commit_batch({"result": build_result(plan, rows, batch_id, 1_795_000_000_000 + batch_id)}, batch_id)


def test_the_page_shows_the_current_result_and_the_totals(monkeypatch, tmp_path):
    plan = build_plan(COUNT_SQL.read_text())
    root = store.sql_dir(tmp_path, "count")
    root.mkdir(parents=True)
    (root / PIPELINE_FILE).write_text(json.dumps(describe_pipeline(plan, "count")))
    writer = SqlSinkWriter(root)
    write_batch(writer, plan, 0, ["upsert", "upsert"], ["100", "101"], [2, 2])
    write_batch(writer, plan, 1, ["delete", "upsert"], ["100", "101"], [None, 3])
    write_batch(writer, plan, 1, ["upsert"], ["102"], [9])  # batch 1 again (a re-run): commits nothing
    progress = root / "metrics" / "progress"
    progress.mkdir(parents=True)
    (progress / "2026-11-23.jsonl").write_text(
        '{"ts_ms": 1, "batch_id": 0, "rows_in": 5, "rows_out": 2, "dead_letters": 0, "lag": 4}\n'
        '{"ts_ms": 2, "batch_id": 1, "rows_in": 3, "rows_out": 2, "dead_letters": 1, "lag": 0}\n')
    app = open_page(monkeypatch, tmp_path)
    metrics = {metric.label: metric.value for metric in app.metric}
    assert (metrics["Rows in"], metrics["Rows out"], metrics["Dead letters"], metrics["Lag"], metrics["Batches"]) == (
        "8", "4", "1", "0", "2")
    shown = app.dataframe[0].value
    assert shown.to_dict("records") == [{"accountId": "101", "userCount": 3}]
    assert any("INSERT INTO user_count_by_account" in code.value for code in app.code)


def test_a_statement_set_shows_each_inserts_current_result(monkeypatch, tmp_path):
    """A statement set writes one result table per INSERT (``result_<target>``); the page shows
    each, under its INSERT, with deletes applied."""
    from pipeline.sql.script import build_pipeline
    from pipeline.sql.sink import result_schema
    from pipeline.sql.statement_set import result_sink
    from sqlhelp import SQL_DIR

    plans = build_pipeline((SQL_DIR / "account_counts_and_named_users.sql").read_text())
    root = store.sql_dir(tmp_path, "set")
    root.mkdir(parents=True)
    (root / PIPELINE_FILE).write_text(json.dumps(describe_pipeline(plans, "set")))
    sinks = [result_sink(plans, i) for i in range(len(plans))]
    writer = SqlSinkWriter(root, sinks)

    def changes(plan, batch_id: int, rows: list[dict]) -> pa.Table:
        schema = result_schema(plan)
        full = [{**{name: None for name in schema.names}, **row, "_batch_id": batch_id} for row in rows]
        return pa.Table.from_pylist(full, schema=schema)

    writer.commit_batch({
        sinks[0]: changes(plans[0], 0, [{"_key": "100", "_op": "upsert", "accountId": "100", "userCount": 2}]),
        sinks[1]: changes(plans[1], 0, [{"_key": "u1", "_op": "upsert", "uid": "u1", "accountId": "100", "name": "ADA"},
                                        {"_key": "u2", "_op": "upsert", "uid": "u2", "accountId": "100", "name": "BO"}]),
    }, 0)
    writer.commit_batch({sinks[1]: changes(plans[1], 1, [{"_key": "u2", "_op": "delete"}])}, 1)
    app = open_page(monkeypatch, tmp_path)
    assert "statement set of 2 INSERTs" in " ".join(caption.value for caption in app.caption)
    shown = [frame.value.to_dict("records") for frame in app.dataframe]
    assert shown == [[{"accountId": "100", "userCount": 2}], [{"uid": "u1", "accountId": "100", "name": "ADA"}]]
    headings = " ".join(str(markdown.value) for markdown in app.markdown)
    assert "INSERT INTO `user_count_by_account`" in headings and "INSERT INTO `user_names`" in headings
