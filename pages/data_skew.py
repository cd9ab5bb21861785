"""Data skew: which keys get the most orders, how evenly the stateful stages' tasks share the work,
and how rows spread over the source partitions."""

import pandas as pd
import streamlit as st

from app import charts, console_math, metric_queries, missing_words, queries, views
from app.resources import REFRESH_SECONDS, fetch

KEY_WINDOW_S = 5 * 60
TASK_BATCHES = 30
PARTITION_BATCHES = 100
HOT_KEYS = 10
TOP_FRACTION = 0.01

settings = views.load_page_settings()
data_dir = settings.data_dir
views.render_page_header(
    "Data skew",
    "Hot keys put most of the state work on a few tasks. Each lookup is keyed by its id, so a task's "
    "rows are the orders and changelog records of the ids it owns. Skew % per stage is Flink's: "
    "min(mean absolute deviation ÷ mean × 100, 100) over the row counts of the stage's tasks "
    "(0 % = even, 100 % = all on few tasks).",
    settings,
)


def render_key_load() -> None:
    """Hot users and items in the newest minutes."""
    st.subheader("Orders per key")
    totals = fetch(queries.load_sink_spans, data_dir=data_dir).set_index("sink")
    newest_ms = totals.loc[["enriched", "missing_state"], "newest_ms"].max()
    if pd.isna(newest_ms):
        views.render_empty_state(f"No orders yet, so no keys to rank — {views.START_HINT}.")
        return
    load = fetch(queries.load_key_load, data_dir=data_dir, window_end_ms=int(newest_ms),
                 window_s=KEY_WINDOW_S, limit=HOT_KEYS, top_fraction=TOP_FRACTION)
    loads = {key: load[load["key"] == key] for key in missing_words.LOOKUP_NAMES}
    st.caption(f"Orders committed in the {KEY_WINDOW_S // 60} minutes up to the newest one, enriched or missing.")
    for column, (key, load) in zip(st.columns(len(loads)), loads.items()):
        spread = load.iloc[0]
        column.metric(
            f"Share of orders on the top 1 % of {key}s",
            f"{spread['top_share']:.1%}",
            help=f"The {int(spread['top_keys']):,} busiest of {int(spread['total_keys']):,} {key} ids "
                 f"hold {int(spread['top_orders']):,} of {int(spread['total_orders']):,} orders "
                 "(enriched and missing state).",
            border=True,
        )
        column.plotly_chart(charts.build_hot_keys_chart(load, key), key=f"hot_{key}")


@st.fragment(run_every=REFRESH_SECONDS)
def render_stage_skew() -> None:
    st.subheader("Stateful stages")
    tasks = fetch(metric_queries.load_recent_tasks, data_dir=data_dir, batches=TASK_BATCHES)
    if tasks.empty:
        views.render_empty_state(f"No task metrics yet; the job writes them for every batch — {views.START_HINT}.")
        return
    skew = console_math.compute_skew_by_batch(tasks)
    latest_batch = int(tasks["batch_id"].max())
    latest_skew = skew[skew["batch_id"] == latest_batch]
    views.render_metric_cards([
        views.MetricCard(f"Skew of {row.stage}", f"{row.skew_percent:.0f} %",
                         help=f"Batch {latest_batch}: {row.records:,} rows (orders, changelog records and dead letters "
                              f"passing through) over {row.tasks} tasks.")
        for row in latest_skew.itertuples()
    ] + [views.MetricCard("Worst skew, last batches", f"{skew['skew_percent'].max():.0f} %",
                          help=f"Highest skew % of any stage over the newest {TASK_BATCHES} batches.")])
    latest_tasks = tasks[tasks["batch_id"] == latest_batch]
    records_column, duration_column = st.columns(2)
    records_column.plotly_chart(charts.build_task_chart(latest_tasks, "records", f"Rows per task, batch {latest_batch}",
                                                        "rows"), key="task_records")
    duration_column.plotly_chart(charts.build_task_chart(latest_tasks, "duration_ms", f"Duration per task, batch {latest_batch}",
                                                         "ms"), key="task_duration")
    st.plotly_chart(charts.build_skew_chart(skew), key="skew_trend")
    for column, (stage, stage_tasks) in zip(st.columns(2), tasks.groupby("stage", sort=True)):
        column.plotly_chart(charts.build_task_heatmap(stage_tasks, stage), key=f"heatmap_{stage}")
    st.caption(f"The newest {TASK_BATCHES} batches.")


def render_partitions() -> None:
    st.subheader("Rows per source partition")
    partitions = fetch(metric_queries.load_partition_rows, data_dir=data_dir, batches=PARTITION_BATCHES)
    if partitions.empty:
        views.render_empty_state(f"No batches recorded yet — {views.START_HINT}.")
        return
    st.plotly_chart(charts.build_partition_chart(partitions), key="partitions")
    st.caption(f"Summed over the newest {PARTITION_BATCHES} batches.")


render_key_load()
render_stage_skew()
render_partitions()
