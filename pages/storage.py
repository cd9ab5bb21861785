"""Storage: what the job keeps on disk, part by part, and when compaction, vacuum and the metrics
retention last ran."""

import streamlit as st

from app import storage, views
from app.resources import fetch

settings = views.load_page_settings()
data_dir = settings.data_dir
views.render_page_header(
    "Storage",
    "Files and bytes of each sink (Delta tables: the current version, the files compaction replaced "
    "until vacuum removes them, the log), each metrics stream, the checkpoint and the savepoints. "
    f"Compaction runs every {settings['sinks.compact_interval']:g} s, vacuum keeps replaced files "
    f"{settings['sinks.vacuum_retention'] / 3600:g} h (longer for the oldest savepoint), and metrics day files "
    f"stay {settings['metrics.retention'] / 86400:g} days.",
    settings,
)


def render_parts() -> None:
    parts = fetch(storage.load_storage, data_dir=data_dir)
    if parts.empty or not parts["files"].sum():
        views.render_empty_state(f"Nothing on disk yet — {views.START_HINT}.")
        return
    by_kind = parts.groupby("kind")[["files", "bytes"]].sum()

    def card(kind: str, label: str) -> views.MetricCard:
        files, size = (by_kind.loc[kind] if kind in by_kind.index else (0, 0))
        return views.MetricCard(label, views.format_bytes(size), help=f"{views.format_count(files)} files")

    views.render_metric_cards([
        views.MetricCard("Data dir", views.format_bytes(parts["bytes"].sum()),
                         help=f"{views.format_count(parts['files'].sum())} files in all"),
        card("sink", "Sinks"), card("metrics", "Metrics"), card("checkpoint", "Checkpoint"),
        card("savepoints", "Savepoints"),
    ])
    st.subheader("On disk, part by part")
    views.render_table(parts.drop(columns=["kind"]), column_config={
        "bytes": st.column_config.NumberColumn("bytes", format="%d"),
        "live_files": st.column_config.NumberColumn("current files", format="%d"),
        "live_bytes": st.column_config.NumberColumn("current bytes", format="%d"),
        "log_files": st.column_config.NumberColumn("Delta log files", format="%d"),
    })


def render_maintenance() -> None:
    st.subheader("Compaction, vacuum and retention")
    rounds = fetch(storage.load_maintenance, data_dir=data_dir)
    if rounds["last_run"].isna().all() and rounds["last_change"].isna().all() and rounds["failed_at"].isna().all():
        views.render_empty_state("No maintenance round yet: the running job compacts and vacuums every "
                                 f"{settings['sinks.compact_interval']:g} s (sinks.compact_interval; 0 = never).")
    views.render_table(rounds, column_config={
        "last_run": st.column_config.DatetimeColumn("last round (UTC)", format="YYYY-MM-DD HH:mm:ss"),
        "last_change": st.column_config.DatetimeColumn("last change (UTC)", format="YYYY-MM-DD HH:mm:ss"),
        "failed_at": st.column_config.DatetimeColumn("failed (UTC)", format="YYYY-MM-DD HH:mm:ss"),
    })


render_parts()
render_maintenance()
