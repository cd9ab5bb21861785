"""Checkpoints: the history of committed micro-batches, restarts and restores, and savepoints to
take and restore."""

import pandas as pd
import streamlit as st

from app import charts, metric_queries, views
from app.resources import REFRESH_SECONDS, fetch
from app.sources import DURATION_PHASES
from pipeline.errors import StatefulStreamsError

HISTORY = 100
PHASES = [f"{phase}_ms" for phase in DURATION_PHASES if phase != "triggerExecution"]
LIFECYCLE = ("job_started", "restart", "job_failed", "job_stopped", "savepoint_taken", "savepoint_restored")

settings = views.load_page_settings()
data_dir = settings.data_dir
views.render_page_header(
    "Checkpoints & savepoints",
    "Every committed micro-batch is a checkpoint of the job's offsets and RocksDB state, like Flink's "
    "checkpoint history.",
    settings,
)


def lookup_cards() -> list:
    """Keys held per lookup and the orders waiting, from the job's newest state census."""
    lookups = fetch(metric_queries.load_lookup_state, data_dir=data_dir)
    if lookups.empty:
        return [views.MetricCard("Keys held", "–", help="The job counts its state after its first batches.")]
    cards = [views.MetricCard(f"{row.lookup.capitalize()} held", views.format_count(row.keys_held),
                              help=f"Keys with a latest record in the {row.lookup} lookup's RocksDB state at batch "
                                   f"{row.batch_id} (Spark's state rows less the keys with waiting orders).")
             for row in lookups.itertuples()]
    waiting = int(lookups["waiting_orders"].sum())
    return cards + [views.MetricCard("Orders waiting", views.format_count(waiting),
                                     help="Orders buffered for a user or item that has not arrived yet (max_wait), "
                                          "read from the lookups' state store.")]


@st.fragment(run_every=REFRESH_SECONDS)
def render_history() -> None:
    batches = fetch(metric_queries.load_batches, data_dir=data_dir, limit=HISTORY)
    if batches.empty:
        views.render_empty_state(f"No committed batches yet — {views.START_HINT}.")
        return
    latest = batches.iloc[-1]
    restarts = fetch(metric_queries.load_event_counts, data_dir=data_dir).set_index("kind")["events"].get("restart", 0)
    views.render_metric_cards([
        views.MetricCard("Last batch", views.format_count(latest["batch_id"]),
                         help=f"The newest committed batch, triggered {views.format_time(latest['trigger_time'])}."),
        views.MetricCard("Its duration", views.format_ms(latest["batch_duration_ms"])),
        views.MetricCard("State size on disk", views.format_bytes(latest["state_size_bytes"])),
        views.MetricCard("RocksDB commit", views.format_ms(latest["rocksdb_commit_ms"]),
                         help="Sum of the RocksDB commit phases (rocksdbCommit…Latency: flush, compact, checkpoint, "
                              "file sync) over the operators, newest batch."),
        views.MetricCard("Restarts", views.format_count(restarts), help="Restart events over the whole metrics store."),
    ])
    views.render_metric_cards(lookup_cards())
    phases_column, state_column = st.columns(2)
    phases_column.plotly_chart(charts.build_phase_chart(batches, PHASES), key="phases")
    state_column.plotly_chart(charts.build_state_chart(batches), key="state")

    st.subheader("Checkpoint history")
    history = batches.iloc[::-1]
    ms = lambda label: st.column_config.NumberColumn(label, format="%d")  # noqa: E731 - one column style
    views.render_table(
        history[["batch_id", "trigger_time", "batch_duration_ms", *PHASES, "num_input_rows", "state_rows",
                 "state_rows_updated", "state_size_bytes", "state_commit_ms", "rocksdb_commit_ms"]],
        column_config={
            "batch_id": st.column_config.NumberColumn("batch", format="%d"),
            "trigger_time": st.column_config.DatetimeColumn("trigger time (UTC)", format="YYYY-MM-DD HH:mm:ss.SSS"),
            "batch_duration_ms": ms("duration (ms)"),
            **{phase: ms(phase.removesuffix("_ms") + " (ms)") for phase in PHASES},
            "num_input_rows": ms("rows"),
            "state_rows": ms("state rows"),
            "state_rows_updated": ms("state rows updated"),
            "state_size_bytes": ms("state size (bytes)"),
            "state_commit_ms": ms("state commit (ms)"),
            "rocksdb_commit_ms": ms("RocksDB commit (ms)"),
        },
        height=360,
    )


def render_restarts() -> None:
    st.subheader("Starts, restarts and restores")
    events = fetch(metric_queries.load_events, data_dir=data_dir, kinds=LIFECYCLE, limit=100)
    if events.empty:
        views.render_empty_state(f"No job events yet — {views.START_HINT}.")
        return
    views.render_table(events[["time", "kind", "message"]], column_config={
        "time": st.column_config.DatetimeColumn("time (UTC)", format="YYYY-MM-DD HH:mm:ss.SSS"),
    })


def render_savepoints() -> None:
    st.subheader("Savepoints")
    try:
        savepoints = views.load_control().list_savepoints(settings)
    except (ModuleNotFoundError, StatefulStreamsError) as exc:
        st.error(f"Cannot list savepoints: {exc}")
        return
    if savepoints:
        listing = pd.DataFrame([{"name": info.name, "batch_id": info.batch_id, "taken_at": info.taken_at,
                                 "size": views.format_bytes(info.size_bytes)} for info in savepoints])
        views.render_table(listing, column_config={"batch_id": st.column_config.NumberColumn("batch", format="%d"),
                                                   "taken_at": "taken at"})
    else:
        views.render_empty_state("No savepoints yet — take one below, or with `python -m pipeline savepoint take`.")

    take_column, restore_column = st.columns(2)
    with take_column:
        name = st.text_input("Name of the new savepoint", key="savepoint_name", placeholder="empty = a timestamp")

        def take() -> str:
            info = views.load_control().take_savepoint(settings, name.strip() or None)
            return f"Savepoint {info.name!r} taken at batch {info.batch_id} ({views.format_bytes(info.size_bytes)})."

        views.render_confirmed_action("take_savepoint", "Take savepoint…",
                                      f"copy the checkpoint of the last committed batch to savepoint {name.strip() or '(timestamp)'!r}.",
                                      take, settings)
    with restore_column:
        names = [info.name for info in savepoints]
        chosen = st.selectbox("Savepoint to restore", names, key="restore_name", index=None,
                              placeholder="choose a savepoint" if names else "no savepoints yet")

        def restore() -> str:
            info = views.load_control().restore_savepoint(settings, chosen)
            warnings = "".join(f" Warning: {w}." for w in getattr(info, "warnings", ()))
            return (f"Restored savepoint {info.name!r} (batch {info.batch_id}); start the job with "
                    f"`python -m pipeline run` to continue from it.{warnings}")

        views.render_confirmed_action("restore_savepoint", "Restore savepoint…",
                                      f"replace the job's checkpoint with savepoint {chosen!r}. The job must be stopped; "
                                      "it will resume from that savepoint's batch.",
                                      restore, settings, disabled=chosen is None)


render_history()
render_restarts()
render_savepoints()
