"""Replay: re-read the users or items changelog into the running job, follow its progress, and
see every replay asked for so far."""

from datetime import datetime, time, timezone

import streamlit as st

from app import console_math, metric_queries, missing_words, views
from app.resources import REFRESH_SECONDS, fetch

START_OPTIONS = ("the earliest retained message", "a chosen time (UTC)")

settings = views.load_page_settings()
data_dir = settings.data_dir
views.render_page_header(
    "Replay",
    "A replay makes the running job re-read a changelog topic and re-apply every version in order; "
    "orders keep flowing meanwhile.",
    settings,
)


def render_request() -> None:
    st.subheader("Request a replay")
    topic_column, start_column = st.columns(2)
    topic = topic_column.radio("Topic", missing_words.CHANGELOGS, horizontal=True, key="replay_topic")
    start = start_column.radio("Start from", START_OPTIONS, horizontal=True, key="replay_start")
    from_time = None
    if start == START_OPTIONS[1]:
        date_column, time_column = st.columns(2)
        day = date_column.date_input("Date (UTC)", key="replay_date")
        moment = time_column.time_input("Time (UTC)", value=time(0, 0), key="replay_time", step=60)
        from_time = datetime.combine(day, moment, tzinfo=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def perform() -> str:
        request = views.load_control().request_replay(settings, topic, from_time=from_time, requested_by="console")
        return (f"Replay #{request['seq']} of {request['topic']} requested from {request['from']}; "
                "the running job picks it up at its next batch.")

    origin = from_time or "the earliest retained message"
    views.render_confirmed_action(
        "replay", f"Replay {topic}…",
        f"make the job re-read {settings.topics[topic]} from {origin} and re-apply every version to its state.",
        perform, settings,
    )


@st.fragment(run_every=REFRESH_SECONDS)
def render_job_status() -> None:
    views.render_job_status(views.load_job_status(data_dir))


@st.fragment(run_every=REFRESH_SECONDS)
def render_replays() -> None:
    replays = fetch(metric_queries.load_replays, data_dir=data_dir)
    st.subheader("In progress")
    running = replays[replays["finished_at"].isna()]
    if running.empty:
        st.caption("No replay is running.")
    for replay in running.itertuples():
        render_running_replay(replay)
    st.subheader("History")
    if replays.empty:
        views.render_empty_state("No replays yet — request one above, or with `python -m pipeline replay users`.")
        return
    views.render_table(replays.drop(columns=["started_ms"]), column_config={
        "seq": st.column_config.NumberColumn("#", format="%d"),
        "from_position": "from",
        "requested_by": "requested by",
        "requested_at": st.column_config.DatetimeColumn("requested (UTC)", format="YYYY-MM-DD HH:mm:ss"),
        "started_at": st.column_config.DatetimeColumn("started (UTC)", format="YYYY-MM-DD HH:mm:ss"),
        "target_position": st.column_config.NumberColumn("target position", format="%d"),
        "finished_at": st.column_config.DatetimeColumn("finished (UTC)", format="YYYY-MM-DD HH:mm:ss"),
        "messages": st.column_config.NumberColumn("messages re-applied"),
        "duration_ms": st.column_config.NumberColumn("took (ms)"),
    }, placeholder="–")


def render_running_replay(replay) -> None:
    origin = f" from {replay.from_position}" if isinstance(replay.from_position, str) else ""
    label = f"Replay #{replay.seq} of {replay.topic}{origin}"
    if views.is_missing(replay.started_ms):
        st.info(f"{label}: requested {views.format_time(replay.requested_at)} by {replay.requested_by}; "
                "waiting for the job to pick it up.", icon=":material/schedule:")
        return
    positions = fetch(metric_queries.load_topic_positions, data_dir=data_dir, topic=replay.topic, since_ms=int(replay.started_ms))
    progress = console_math.locate_replay(positions, replay.target_position, generation=int(replay.seq))
    if progress.current_position is None:
        st.info(f"{label}: started {views.format_time(replay.started_at)}; no batch has read it yet.",
                icon=":material/schedule:")
        return
    if progress.fraction is None:
        st.info(f"{label}: started {views.format_time(replay.started_at)}; "
                f"{progress.current_position - progress.start_position:,} broker entries "
                f"({progress.messages:,} messages) re-read so far.",
                icon=":material/autorenew:")
        return
    st.progress(progress.fraction, text=(
        f"{label}: {progress.current_position - progress.start_position:,} of "
        f"{progress.target_position - progress.start_position:,} broker entries re-read "
        f"({progress.fraction:.0%}; {progress.messages:,} messages so far)"
    ))


render_job_status()
render_request()
render_replays()
