"""SQL pipelines: each pipeline's statements, rows in and out, lag, recent events and its current
result table, read with DuckDB from the pipeline's own folder (pipeline/sql/)."""

import streamlit as st

from app import sql_queries, views
from app.resources import REFRESH_SECONDS, fetch

EMPTY = ("No SQL pipelines yet — run one with `python -m pipeline sql data/sql/user_count_by_account.sql` "
         "(`make demo` runs both examples under data/sql/).")

settings = views.load_page_settings()
data_dir = settings.data_dir
views.render_page_header(
    "SQL pipelines",
    "Flink-style SQL over changelog topics, run as Spark streaming queries: each result is the latest "
    "row per primary key, kept up to date as the source tables change.",
    settings,
)


def what_it_does(info: dict) -> str:
    """One INSERT's kind in words: the statement itself is under "Statements"."""
    if info["kind"] == "aggregate":
        return "GROUP BY aggregation"
    return "join" if len(info["sources"]) > 1 else "query"


def into(info: dict) -> str:
    return f"`{info['target']}` → {info['target_topic']} (key `{info['primary_key']}`)"


def render_result(name: str, info: dict, sink: str) -> None:
    result = fetch(sql_queries.current_result, data_dir=data_dir, name=name, sink=sink)
    if result.empty:
        views.render_empty_state(f"`{info['target']}` has no result rows yet: publish to its source topics.")
    else:
        st.markdown(f"**Current result of `{info['target']}`** ({len(result)} rows, latest row per "
                    f"`{info['primary_key']}`)")
        views.render_table(result)


def render_pipeline(info: dict) -> None:
    name = info["name"]
    st.subheader(name)
    sources = ", ".join(f"`{table}` ← {topic}" for table, topic in info["sources"].items())
    inserts = info.get("inserts")
    if inserts:
        st.caption(f"statement set of {len(inserts)} INSERTs, one query reading {sources} once per batch")
    else:
        st.caption(f"{what_it_does(info)} of {sources} into {into(info)}")
    totals = fetch(sql_queries.pipeline_totals, data_dir=data_dir, name=name)
    lag = totals["lag"]
    views.render_metric_cards([
        views.MetricCard("Rows in", views.format_count(totals["rows_in"]), help="messages read from the source topics"),
        views.MetricCard("Rows out", views.format_count(totals["rows_out"]),
                         help="upserts and deletes written to the result topic and table"),
        views.MetricCard("Dead letters", views.format_count(totals["dead_letters"]),
                         help="messages of the wrong type, bad JSON or without a key"),
        views.MetricCard("Lag", "–" if lag is None else views.format_count(lag),
                         help="broker entries on the source topics not yet read, at the last batch (an entry is one message or one producer batch)"),
        views.MetricCard("Batches", views.format_count(totals["batches"])),
    ])
    with st.expander("Statements"):
        for statement in info["statements"]:
            st.code(statement, language="sql")
    if inserts:
        for insert in inserts:
            st.markdown(f"INSERT INTO {into(insert)}: {what_it_does(insert)}")
            render_result(name, insert, insert["sink"])
    else:
        render_result(name, info, "result")
    dead = fetch(sql_queries.dead_letters, data_dir=data_dir, name=name)
    if not dead.empty:
        st.markdown("**Dead letters**")
        views.render_table(dead)
    events = fetch(sql_queries.pipeline_events, data_dir=data_dir, name=name)
    if not events.empty:
        with st.expander("Events"):
            views.render_table(events)


@st.fragment(run_every=REFRESH_SECONDS)
def render_pipelines() -> None:
    pipelines = sql_queries.list_pipelines(data_dir)
    if not pipelines:
        views.render_empty_state(EMPTY)
        return
    for info in pipelines:
        render_pipeline(info)


render_pipelines()
