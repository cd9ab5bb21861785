"""Backpressure: whether the job keeps up — input vs processing rate, batch duration vs trigger
interval, the backlog of unread broker entries per topic, and what each batch admitted (changelogs
first: were the orders held back, and how many got a share while the changelogs filled the cap)."""

import streamlit as st

from app import charts, console_math, metric_queries, views
from app.resources import REFRESH_SECONDS, fetch

BATCHES = 300
TABLE_BATCHES = 30

settings = views.load_page_settings()
data_dir = settings.data_dir
views.render_page_header(
    "Backpressure",
    f"From the job's progress rows, the newest {BATCHES} micro-batches. Refreshes every {REFRESH_SECONDS} s.",
    settings,
)
st.info(console_math.BACKPRESSURE_DEFINITION, icon=":material/straighten:")


@st.fragment(run_every=REFRESH_SECONDS)
def render_backpressure() -> None:
    batches = fetch(metric_queries.load_batches, data_dir=data_dir, limit=BATCHES)
    if batches.empty:
        views.render_empty_state(f"No micro-batches recorded yet — {views.START_HINT}.")
        return
    batches = console_math.classify_batches(batches)
    latest = batches.iloc[-1]
    backlog = fetch(metric_queries.load_backlog, data_dir=data_dir, limit=BATCHES)
    orders_backlog = backlog[backlog["topic"] == "orders"]
    growth = console_math.compute_backlog_growth(orders_backlog["ts_ms"].tolist(), orders_backlog["backlog"].tolist())
    levels = batches["level"].value_counts()
    latest_orders_backlog = orders_backlog["backlog"].iloc[-1] if not orders_backlog.empty else None
    views.render_metric_cards([
        views.MetricCard("Latest batch", f"{latest['level']} · {latest['backpressure_ratio']:.0%}",
                         help=f"Batch {int(latest['batch_id'])}: {views.format_ms(latest['batch_duration_ms'])} "
                              f"against a {views.format_ms(latest['trigger_interval_ms'])} trigger interval."),
        views.MetricCard("HIGH / LOW batches", f"{levels.get('HIGH', 0)} / {levels.get('LOW', 0)}",
                         help=f"Of the newest {len(batches)} batches."),
        views.MetricCard("Input rate", views.format_rate(latest["input_rows_per_second"]),
                         help="Rows that arrived per second since the previous batch (Spark's inputRowsPerSecond)."),
        views.MetricCard("Processing rate", views.format_rate(latest["processed_rows_per_second"]),
                         help="Rows processed per second of batch time (Spark's processedRowsPerSecond)."),
        views.MetricCard("Orders backlog", views.format_count(latest_orders_backlog),
                         None if growth is None else f"{growth:+,.1f} entries/s",
                         help="Broker entries on the orders topic the job has not read yet (an entry is one "
                              "message, or one producer batch of them: the job plans batches without reading "
                              "messages); the delta is the trend (least-squares slope) over the batches shown."),
    ])
    rates_column, duration_column = st.columns(2)
    rates_column.plotly_chart(charts.build_rates_chart(batches), key="rates")
    duration_column.plotly_chart(charts.build_batch_duration_chart(batches), key="durations")
    st.plotly_chart(charts.build_backlog_chart(backlog), key="backlog")
    render_watermarks()

    st.subheader("Newest batches")
    recent = batches.iloc[::-1].head(TABLE_BATCHES)
    recent = recent.assign(orders_admission=[console_math.describe_orders_admission(*flags) for flags in zip(
        recent["orders_held"], recent["orders_shared"], recent["orders_held_for"])])
    views.render_table(
        recent[["batch_id", "trigger_time", "level", "backpressure_ratio", "batch_duration_ms", "trigger_interval_ms",
                "num_input_rows", "input_rows_per_second", "processed_rows_per_second", "orders_admission",
                "orders_rows"]],
        column_config={
            "batch_id": st.column_config.NumberColumn("batch", format="%d"),
            "trigger_time": st.column_config.DatetimeColumn("trigger time (UTC)", format="YYYY-MM-DD HH:mm:ss.SSS"),
            "backpressure_ratio": st.column_config.ProgressColumn("ratio", format="percent", min_value=0.0, max_value=1.0),
            "batch_duration_ms": st.column_config.NumberColumn("duration (ms)"),
            "trigger_interval_ms": st.column_config.NumberColumn("interval (ms)"),
            "num_input_rows": st.column_config.NumberColumn("rows"),
            "input_rows_per_second": st.column_config.NumberColumn("input rows/s", format="%.1f"),
            "processed_rows_per_second": st.column_config.NumberColumn("processed rows/s", format="%.1f"),
            "orders_admission": st.column_config.TextColumn("orders", help=console_math.ADMISSION_DEFINITION),
            "orders_rows": st.column_config.NumberColumn("orders read"),
        },
    )
    render_admission(batches, backlog)


def render_admission(batches, backlog) -> None:
    """Changelogs first: what the planner admitted per topic and batch, the batches that held the
    orders back, and the orders admitted while the changelogs filled the cap (share events)."""
    st.subheader("Admission: changelogs first")
    st.caption(console_math.ADMISSION_DEFINITION)
    shares = fetch(metric_queries.load_order_shares, data_dir=data_dir)
    latest = batches.iloc[-1]
    held = batches["orders_held"].fillna(False).astype(bool)
    shared_orders, complete = console_math.sum_order_shares(shares["orders"].tolist())
    sharing = shares[shares["open"]]
    views.render_metric_cards([
        views.MetricCard("Orders in the newest batch", console_math.describe_orders_admission(
            latest["orders_held"], latest["orders_shared"], latest["orders_held_for"]),
            help=f"Batch {int(latest['batch_id'])}. " + console_math.ADMISSION_DEFINITION),
        views.MetricCard("Batches that held orders back", f"{int(held.sum())} / {len(batches)}",
                         help=f"Of the newest {len(batches)} batches: the changelogs alone filled the cap and "
                              "no order was admitted."),
        views.MetricCard("Orders admitted while the changelogs filled the cap",
                         views.format_count(shared_orders) + ("" if complete else " +"),
                         None if sharing.empty else f"sharing since batch {int(sharing['started_batch'].iloc[0])}",
                         help=f"Over {len(shares)} share runs (orders_share_started / orders_share_ended events); "
                              "exact counts of the orders read in the shared batches, the open run's so far."
                              + ("" if complete else " A run whose batches were not all counted is left out.")),
    ])
    admitted = backlog.dropna(subset=["admitted_messages"])
    if admitted.empty:
        st.caption("No batch recorded what its planner admitted yet (the job's source predates it).")
    else:
        messages_column, bytes_column = st.columns(2)
        messages_column.plotly_chart(charts.build_admitted_chart(
            admitted, "admitted_messages", "Messages admitted per batch (estimated)", "messages"), key="admitted_messages")
        bytes_column.plotly_chart(charts.build_admitted_chart(
            admitted.dropna(subset=["admitted_bytes"]), "admitted_bytes", "Bytes admitted per batch (estimated)", "bytes"),
            key="admitted_bytes")
    if not shares.empty:
        views.render_table(
            shares[["started_batch", "started_at", "ended_at", "last_batch", "batches", "held_for", "orders"]],
            column_config={
                "started_batch": st.column_config.NumberColumn("from batch", format="%d"),
                "started_at": st.column_config.DatetimeColumn("started (UTC)", format="YYYY-MM-DD HH:mm:ss"),
                "ended_at": st.column_config.DatetimeColumn("ended (UTC)", format="YYYY-MM-DD HH:mm:ss"),
                "last_batch": st.column_config.NumberColumn("to batch", format="%d"),
                "batches": st.column_config.NumberColumn("shared batches"),
                "held_for": st.column_config.NumberColumn("filled in a row (most)"),
                "orders": st.column_config.NumberColumn("orders admitted"),
            },
            placeholder="–",
        )


def render_watermarks() -> None:
    """Event time only: each topic's watermark, how far it lags, which partitions are idle, and
    the late changelog versions counted."""
    watermarks = fetch(metric_queries.load_watermarks, data_dir=data_dir)
    if watermarks.empty:
        return
    st.subheader("Event-time watermarks")
    partitions = fetch(metric_queries.load_partition_watermarks, data_dir=data_dir)
    idle = watermarks.loc[watermarks["idle"].fillna(False).astype(bool), "topic"].tolist()
    idle += [f"{row.topic} partition {int(row.partition)}" for row in partitions.itertuples()
             if row.idle and row.topic not in idle]
    st.caption(f"Batch {int(watermarks['batch_id'].iloc[0])}. A partition's watermark is the newest event time read "
               "from it minus enrichment.out_of_orderness, a topic's the least of its partitions'; orders wait "
               "until every partition of both changelogs has passed their time. "
               "Lag: how far it is behind the newest event time read from any topic. Late versions: changelog "
               "versions read older than the watermark minus enrichment.allowed_lateness (stored, counted). "
               + (f"Idle (no longer holding the watermark back): {', '.join(idle)}." if idle else "Nothing is idle."))
    shown = watermarks.assign(idle=watermarks["idle"].map(lambda flag: "idle" if flag else ""))
    times = {name: st.column_config.DatetimeColumn(label, format="YYYY-MM-DD HH:mm:ss.SSS") for name, label in (
        ("watermark", "watermark (UTC)"), ("newest", "newest event time read (UTC)"),
        ("job_watermark", "job watermark (UTC)"))}
    views.render_table(shown[["topic", "watermark", "lag_ms", "newest", "idle", "late_versions", "job_watermark"]],
                       column_config={**times, "lag_ms": st.column_config.NumberColumn("lag (ms)"),
                                      "late_versions": st.column_config.NumberColumn("late versions")})
    if not partitions.empty:
        st.caption("Partitions of the partitioned topics (a topic's watermark is the least of these, idle ones aside).")
        views.render_table(partitions.assign(idle=partitions["idle"].map(lambda flag: "idle" if flag else "")),
                           column_config={name: times[name] for name in ("watermark", "newest")})


render_backpressure()
