"""Live enrichment: how many orders get enriched, go missing or dead-letter, how fast, and the newest ones."""

import pandas as pd
import streamlit as st

from app import charts, console_math, metric_queries, queries, views
from app.resources import REFRESH_SECONDS, fetch, refresh_tick_ms

WINDOW_S = 5 * 60

settings = views.load_page_settings()
data_dir = settings.data_dir
views.render_page_header(
    "Live enrichment",
    f"Orders enriched with the latest user and item, as committed to the sinks. Refreshes every {REFRESH_SECONDS} s.",
    settings,
)


@st.fragment(run_every=REFRESH_SECONDS)
def render_live() -> None:
    views.render_job_status(views.load_job_status(data_dir))
    totals = fetch(queries.load_sink_totals, data_dir=data_dir, now_ms=refresh_tick_ms()).set_index("sink")
    if int(totals["rows"].sum()) == 0:
        views.render_empty_state(f"No enriched orders yet — {views.START_HINT}.")
        return
    window_end_ms = int(totals["newest_ms"].max())
    window_s, bucket_s = console_math.choose_window(int(totals["oldest_ms"].min()), window_end_ms, WINDOW_S)
    latency = fetch(queries.load_latency, data_dir=data_dir, window_end_ms=window_end_ms,
                    window_s=window_s, bucket_s=bucket_s)
    latency_in_window = latency.iloc[0]
    rate_help = "Rows committed in the last 60 s ÷ 60."
    latency_help = (f"Published to the orders topic → enriched row committed, over the "
                    f"{console_math.format_age(window_s * 1000)} up to the newest row.")
    lifecycle = fetch(metric_queries.load_latest_lifecycle_event, data_dir=data_dir)
    restarted = lifecycle[lifecycle["kind"].isin(["job_started", "restart"])]["ts_ms"]
    start_up = console_math.start_in_window(window_end_ms - window_s * 1000, int(totals["oldest_ms"].min()),
                                            int(restarted.iloc[0]) if len(restarted) else None)
    if start_up is not None:
        latency_help += (" This window includes the job's start-up: its first batches of orders, which warm Spark "
                         "up, weigh on the percentiles.")
    views.render_metric_cards([
        views.MetricCard("Enriched orders", views.format_count(totals.at["enriched", "rows"]),
                         views.format_rate(totals.at["enriched", "rows_per_second"]), rate_help),
        views.MetricCard("Missing state", views.format_count(totals.at["missing_state", "rows"]),
                         views.format_rate(totals.at["missing_state", "rows_per_second"]), rate_help),
        views.MetricCard("Dead letters", views.format_count(totals.at["dead_letter", "rows"]),
                         views.format_rate(totals.at["dead_letter", "rows_per_second"]), rate_help),
        views.MetricCard("Latency p50", views.format_ms(latency_in_window["p50_ms"]), help=latency_help),
        views.MetricCard("Latency p99", views.format_ms(latency_in_window["p99_ms"]), help=latency_help),
    ])

    throughput_column, latency_column = st.columns(2)
    throughput = fetch(queries.load_throughput, data_dir=data_dir, window_end_ms=window_end_ms,
                       window_s=window_s, bucket_s=bucket_s)
    throughput_column.plotly_chart(charts.build_throughput_chart(throughput), key="throughput")
    latency_column.plotly_chart(charts.build_latency_chart(latency[latency["scope"] == "bucket"]), key="latency")
    st.caption(f"Charts: the {console_math.format_age(window_s * 1000)} up to the newest committed row, "
               f"in {bucket_s} s buckets."
               + ("" if start_up is None else
                  f" The window includes the job's start-up at {views.format_time(pd.Timestamp(start_up, unit='ms'))}: the "
                  "latency cards mix its first batches with the steady state after them (the chart shows which)."))

    st.subheader("Newest enriched orders")
    newest = fetch(queries.load_newest_enriched, data_dir=data_dir, limit=20)
    newest = views.drop_unused_as_of(newest)  # processing time: no versions' times
    views.render_table(newest, column_config={
        **views.lookup_column_config(),
        "enriched_at": st.column_config.DatetimeColumn("enriched at (UTC)", format="YYYY-MM-DD HH:mm:ss.SSS"),
        "invoice_id": st.column_config.NumberColumn("invoice", format="%d"),
        "line_item_id": st.column_config.NumberColumn("line", format="%d"),
        "user_name": "user name",
        "user_email": "email",
        "item_name": "item name",
        "item_category": "category",
        "price": st.column_config.NumberColumn(format="%.2f"),
        "batch_id": st.column_config.NumberColumn("batch", format="%d"),
        "source_message_id": "message id",
        "waited_ms": st.column_config.NumberColumn("waited (ms)"),
        "latency_ms": st.column_config.NumberColumn("latency (ms)"),
    })


render_live()
