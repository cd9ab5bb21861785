"""The console's plotly figures: one builder per chart, each from a frame of :mod:`app.queries`.

Builders only draw; they never compute a figure's numbers. Times on the x axes are UTC.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from pipeline.enrich import lookups

SINK_COLOURS = {"enriched": "#2e7d32", "missing_state": "#f9a825", "dead_letter": "#c62828"}
SINK_LABELS = {"enriched": "enriched", "missing_state": "missing state", "dead_letter": "dead letter"}
LEVEL_COLOURS = {"OK": "#2e7d32", "LOW": "#f9a825", "HIGH": "#c62828"}
# Colours follow the lookups (pipeline/enrich/lookups.py) in order, from a palette: the reasons
# a lookup gives (user, item, user_and_item, …), and the topics (the orders, then each
# changelog). Plotly picks its own for any beyond the palette.
REASON_COLOURS = {**dict(zip(lookups.LOOKUP_REASONS, ("#1565c0", "#ef6c00", "#6a1b9a", "#2e7d32", "#ad1457",
                                                      "#4e342e", "#283593", "#9e9d24"))),
                  lookups.LATE: "#757575", lookups.FUTURE: "#00838f"}
TOPIC_COLOURS = dict(zip(("orders", *lookups.CHANGELOGS), ("#1565c0", "#6a1b9a", "#ef6c00", "#2e7d32", "#ad1457")))


def _layout(figure: go.Figure, title: str, y_title: str, x_title: str = "time (UTC)", height: int = 320) -> go.Figure:
    figure.update_layout(
        title={"text": title, "x": 0, "y": 0.98, "yanchor": "top", "font": {"size": 15}},
        height=height,
        margin={"l": 10, "r": 10, "t": 80, "b": 10},
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0},
        xaxis_title=x_title,
        yaxis_title=y_title,
        hovermode="x unified",
    )
    return figure


def build_throughput_chart(throughput: pd.DataFrame) -> go.Figure:
    """Rows per second committed to each sink: ``bucket_start, sink, rows_per_second``."""
    figure = go.Figure()
    for sink, rows in throughput.groupby("sink", sort=False):
        figure.add_scatter(x=rows["bucket_start"], y=rows["rows_per_second"], mode="lines+markers",
                           name=SINK_LABELS.get(sink, sink), line={"color": SINK_COLOURS.get(sink)})
    return _layout(figure, "Rows committed per second, by sink", "rows/s")


def build_latency_chart(latency: pd.DataFrame) -> go.Figure:
    """End-to-end latency p50 and p99 per bucket: ``bucket_start, p50_ms, p99_ms``."""
    figure = go.Figure()
    figure.add_scatter(x=latency["bucket_start"], y=latency["p99_ms"], name="p99", mode="lines+markers",
                       line={"color": "#c62828"})
    figure.add_scatter(x=latency["bucket_start"], y=latency["p50_ms"], name="p50", mode="lines+markers",
                       line={"color": "#1565c0"})
    return _layout(figure, "End-to-end latency (published → enriched)", "ms")


def build_reason_chart(by_reason: pd.DataFrame) -> go.Figure:
    """Missing-state orders per reason, stacked per bucket: ``bucket_start, reason, orders``."""
    figure = go.Figure()
    for reason, rows in by_reason.groupby("reason", sort=True):
        figure.add_bar(x=rows["bucket_start"], y=rows["orders"], name=reason, marker_color=REASON_COLOURS.get(reason))
    figure.update_layout(barmode="stack")
    return _layout(figure, "Missing-state orders by reason", "orders")


def build_hot_keys_chart(hot_keys: pd.DataFrame, key_label: str) -> go.Figure:
    """The hottest keys as horizontal bars: ``key_id, orders, share``."""
    ordered = hot_keys.iloc[::-1]
    figure = go.Figure(go.Bar(
        x=ordered["orders"], y=[f"{key_label} {key}" for key in ordered["key_id"]], orientation="h",
        text=[f"{share:.1%}" for share in ordered["share"]], textposition="auto", marker_color="#1565c0",
    ))
    figure = _layout(figure, f"Hottest {key_label}s by orders", "", x_title="orders")
    figure.update_layout(hovermode="closest", showlegend=False, margin={"t": 40})
    return figure


def build_task_chart(tasks: pd.DataFrame, value: str, title: str, unit: str) -> go.Figure:
    """One bar per task, grouped by stage, for one batch: ``stage, task, <value>``."""
    figure = go.Figure()
    for stage, rows in tasks.groupby("stage", sort=True):
        figure.add_bar(x=[f"task {task}" for task in rows["task"]], y=rows[value], name=stage)
    figure.update_layout(barmode="group", hovermode="closest")
    return _layout(figure, title, unit, x_title="task (partition)")


def build_task_heatmap(tasks: pd.DataFrame, stage: str) -> go.Figure:
    """Records per task (rows) and batch (columns) of one stage: ``batch_id, task, records``."""
    grid = tasks.pivot_table(index="task", columns="batch_id", values="records", aggfunc="sum")
    figure = go.Figure(go.Heatmap(z=grid.values, x=[str(batch) for batch in grid.columns],
                                  y=[f"task {task}" for task in grid.index], colorscale="Blues",
                                  colorbar={"title": "records"}))
    figure = _layout(figure, f"Records per task, {stage}", "", x_title="batch id")
    figure.update_layout(hovermode="closest")
    return figure


def build_skew_chart(skew: pd.DataFrame) -> go.Figure:
    """Skew % per stage over batches: ``batch_id, stage, skew_percent``."""
    figure = go.Figure()
    for stage, rows in skew.groupby("stage", sort=True):
        figure.add_scatter(x=rows["batch_id"], y=rows["skew_percent"], name=stage, mode="lines+markers")
    figure.update_yaxes(range=[0, 100])
    return _layout(figure, "Skew % per stateful stage", "skew %", x_title="batch id")


def build_partition_chart(partitions: pd.DataFrame) -> go.Figure:
    """Rows read per topic partition: ``topic, partition, rows``."""
    figure = go.Figure()
    for topic, rows in partitions.groupby("topic", sort=True):
        figure.add_bar(x=[f"{topic} / {p}" for p in rows["partition"]], y=rows["rows"], name=topic,
                       marker_color=TOPIC_COLOURS.get(topic))
    figure.update_layout(hovermode="closest")
    return _layout(figure, "Rows read per source partition", "rows", x_title="topic / partition")


def build_rates_chart(batches: pd.DataFrame) -> go.Figure:
    """Input rate against processing rate per batch: ``trigger_time, input_rows_per_second, processed_rows_per_second``."""
    figure = go.Figure()
    figure.add_scatter(x=batches["trigger_time"], y=batches["input_rows_per_second"], name="input rate", mode="lines")
    figure.add_scatter(x=batches["trigger_time"], y=batches["processed_rows_per_second"], name="processing rate", mode="lines")
    return _layout(figure, "Input rate vs processing rate", "rows/s")


def build_batch_duration_chart(batches: pd.DataFrame) -> go.Figure:
    """Batch duration coloured by backpressure level, with the trigger interval as a line.

    Expects ``trigger_time, batch_duration_ms, trigger_interval_ms, level``.
    """
    figure = go.Figure()
    for level, rows in batches.groupby("level", sort=False):
        figure.add_bar(x=rows["trigger_time"], y=rows["batch_duration_ms"], name=level,
                       marker_color=LEVEL_COLOURS.get(level))
    figure.add_scatter(x=batches["trigger_time"], y=batches["trigger_interval_ms"], name="trigger interval",
                       mode="lines", line={"color": "#424242", "dash": "dash"})
    return _layout(figure, "Batch duration vs trigger interval", "ms")


def build_backlog_chart(backlog: pd.DataFrame) -> go.Figure:
    """Unread broker entries per topic over time: ``trigger_time, topic, backlog``."""
    figure = go.Figure()
    for topic, rows in backlog.groupby("topic", sort=True):
        figure.add_scatter(x=rows["trigger_time"], y=rows["backlog"], name=topic, mode="lines",
                           line={"color": TOPIC_COLOURS.get(topic)})
    return _layout(figure, "Backlog per topic (broker entries not read yet)", "entries")


def build_admitted_chart(admitted: pd.DataFrame, value: str, title: str, unit: str) -> go.Figure:
    """What the planner admitted per topic and batch, stacked: ``batch_id, topic, <value>``."""
    figure = go.Figure()
    for topic, rows in admitted.groupby("topic", sort=True):
        figure.add_bar(x=rows["batch_id"], y=rows[value], name=topic, marker_color=TOPIC_COLOURS.get(topic))
    figure.update_layout(barmode="stack")
    return _layout(figure, title, unit, x_title="batch id")


def build_phase_chart(batches: pd.DataFrame, phases: list[str]) -> go.Figure:
    """Each batch's duration split by phase, stacked: ``batch_id`` and one column per phase."""
    figure = go.Figure()
    for phase in phases:
        figure.add_bar(x=batches["batch_id"], y=batches[phase], name=phase.removesuffix("_ms"))
    figure.update_layout(barmode="stack")
    return _layout(figure, "Batch duration by phase", "ms", x_title="batch id")


def build_state_chart(batches: pd.DataFrame) -> go.Figure:
    """State rows and state size on disk over batches: ``batch_id, state_rows, state_size_bytes``."""
    figure = go.Figure()
    figure.add_scatter(x=batches["batch_id"], y=batches["state_rows"], name="state rows", mode="lines",
                       line={"color": "#1565c0"})
    figure.add_scatter(x=batches["batch_id"], y=batches["state_size_bytes"], name="state size (bytes)",
                       mode="lines", yaxis="y2", line={"color": "#ef6c00", "dash": "dot"})
    figure.update_layout(yaxis2={"overlaying": "y", "side": "right", "title": "bytes", "showgrid": False})
    return _layout(figure, "State rows and size on disk", "rows", x_title="batch id")
