"""Page parts that several screens share: headers, empty states, metric cards, the job status
banner, tables (personal fields masked off loopback), and control actions behind a confirmation
(and the admin token, if one is set, with a per-client brake on wrong tokens).

Pages call these and stay free of layout details; every number they are given comes from
:mod:`app.queries` over the sinks and the metrics store.
"""

from __future__ import annotations

import importlib
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
import streamlit as st

from app import console_math, metric_queries, missing_words
from app.resources import fetch, get_settings, now_ms
from pipeline.config import Settings
from pipeline.console import MIN_TOKEN_CHARS, is_loopback
from pipeline.errors import StatefulStreamsError

START_HINT = "start the job with `make demo` or `python -m pipeline run`"


def load_page_settings() -> Settings:
    """The console's settings; a bad setting stops the page with its one-line message."""
    try:
        return get_settings()
    except StatefulStreamsError as exc:
        st.error(f"The console cannot load its settings: {exc}")
        st.stop()


def render_page_header(title: str, caption: str, settings: Settings) -> None:
    st.title(title)
    st.caption(f"{caption} Data dir: `{settings.data_dir}`.")
    render_personal_unlock(settings)


def render_empty_state(message: str) -> None:
    """What to do when there is nothing to show yet."""
    st.info(message, icon=":material/hourglass_empty:")


# ------------------------------------------------------------------------ metric cards


@dataclass(frozen=True)
class MetricCard:
    """One number on a card: a label, its value, and an optional delta and tooltip."""

    label: str
    value: str
    delta: str | None = None
    help: str | None = None
    delta_color: str = "off"


def render_metric_cards(cards: Sequence[MetricCard]) -> None:
    """A row of cards, one column each."""
    for column, card in zip(st.columns(len(cards)), cards):
        column.metric(card.label, card.value, delta=card.delta, delta_color=card.delta_color,
                      help=card.help, border=True)


def format_count(value: Any) -> str:
    if value is None or is_missing(value):
        return "–"
    return f"{int(value):,}"


def format_rate(per_second: Any) -> str:
    if per_second is None or is_missing(per_second):
        return "–"
    return f"{float(per_second):,.1f}/s"


def format_ms(value: Any) -> str:
    if value is None or is_missing(value):
        return "–"
    value = float(value)
    return f"{value / 1000:,.2f} s" if value >= 10_000 else f"{value:,.0f} ms"


def format_bytes(value: Any) -> str:
    if value is None or is_missing(value):
        return "–"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} GiB"


def format_time(value: Any) -> str:
    """A timestamp as ``2026-11-22 01:02:03 UTC``; missing as ``–``."""
    if value is None or is_missing(value):
        return "–"
    return pd.Timestamp(value).strftime("%Y-%m-%d %H:%M:%S UTC")


def is_missing(value: Any) -> bool:
    try:
        return bool(pd.isna(value)) or (isinstance(value, float) and math.isnan(value))
    except (TypeError, ValueError):
        return False


def lookup_column_config() -> dict:
    """Table column labels of each lookup's columns: its id (``user``) and, in event time, the
    time of the version an order was decided with (``user as of (event time)``)."""
    return {
        **{column: st.column_config.NumberColumn(name, format="%d") for name, column in missing_words.ID_COLUMNS.items()},
        **{column: st.column_config.DatetimeColumn(f"{name} as of (event time)", format="YYYY-MM-DD HH:mm:ss.SSS")
           for name, column in missing_words.AS_OF_COLUMNS.items()},
    }


def drop_unused_as_of(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without the lookups' as-of columns when none holds a time (processing time)."""
    as_of = list(missing_words.AS_OF_COLUMNS.values())
    return frame.drop(columns=as_of) if frame[as_of].isna().all().all() else frame


def render_table(frame: pd.DataFrame, column_config: dict | None = None, height: int | str = "auto",
                 placeholder: str | None = None) -> None:
    """A table without its index; ``placeholder`` is shown in empty cells. Personal columns are
    masked off loopback until the admin token is given (:func:`mask_personal`)."""
    st.dataframe(mask_personal(frame), hide_index=True, column_config=column_config, height=height, placeholder=placeholder)


# ---------------------------------------------------------------------- job status


def load_job_status(data_dir: Path) -> console_math.JobStatus:
    """The job's status from its newest lifecycle event and its newest batch."""
    return console_math.job_status_from_frames(
        fetch(metric_queries.load_latest_lifecycle_event, data_dir=data_dir),
        fetch(metric_queries.load_batches, data_dir=data_dir, limit=1),
        now_ms(),
        metric_queries.read_heartbeat(data_dir),
    )


def render_job_status(status: console_math.JobStatus) -> None:
    """A coloured banner: running, restarting n/N, stopped with its error, …"""
    show = {"success": st.success, "info": st.info, "warning": st.warning, "error": st.error}[status.level]
    icon = {"success": ":material/play_circle:", "info": ":material/info:",
            "warning": ":material/warning:", "error": ":material/error:"}[status.level]
    show(f"**Job: {status.headline}** — {status.detail}", icon=icon)


# ------------------------------------------------------------------ control actions


class WrongTokenBrake:
    """Slows down guessing the admin token, per client (see :func:`client_id`), across every
    session of the console process: one client's wrong tokens never lock another client out.

    A client's first :attr:`free` wrong tokens in a row cost nothing (typos happen); after that
    each one locks that client's actions for twice as long as the last (1 s, 2 s, 4 s, … up to
    ``max_s``), and a right token resets it. ``clock`` is injected so tests need no sleeping.
    At most ``max_clients`` clients are remembered; the ones whose lock ran out go first.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, free: int = 3, max_s: float = 300.0,
                 max_clients: int = 10_000):
        self.clock, self.free, self.max_s, self.max_clients = clock, free, max_s, max_clients
        self._clients: dict[str, tuple[int, float]] = {}  # client -> (wrong tokens in a row, locked until)
        self._lock = threading.Lock()

    def wait_seconds(self, client: str = "loopback") -> float:
        """How long before this client's next try is even looked at (0 when it is)."""
        with self._lock:
            return max(0.0, self._clients.get(client, (0, 0.0))[1] - self.clock())

    def record(self, right: bool, client: str = "loopback") -> None:
        with self._lock:
            if right:
                self._clients.pop(client, None)
                return
            failures = self._clients.get(client, (0, 0.0))[0] + 1
            locked_until = self.clock() + min(self.max_s, 2.0 ** (failures - self.free - 1)) if failures > self.free else 0.0
            self._clients[client] = (failures, locked_until)
            if len(self._clients) > self.max_clients:
                now = self.clock()
                for name in [name for name, (_, until) in self._clients.items() if until <= now and name != client]:
                    del self._clients[name]


@st.cache_resource(show_spinner=False)
def get_token_brake() -> WrongTokenBrake:
    """The console process's one brake: a new browser session does not reset a client's count."""
    return WrongTokenBrake()


def client_id() -> str:
    """Who is asking, for per-client limits: the remote address of the browser's connection
    (Streamlit's ``st.context.ip_address``, taken from the socket, not from a header), or
    ``loopback`` for a browser on this machine (Streamlit reports those as None).
    Behind a reverse proxy every viewer has the proxy's address: put the limits there too."""
    try:
        address = st.context.ip_address
    except Exception:  # no browser connection (a bare script run)
        address = None
    return address if isinstance(address, str) and address else "loopback"


def check_admin_token(settings: Settings, typed_token: str | None) -> str | None:
    """None if ``typed_token`` may act (or no token is configured), else the line to show.

    Goes through this client's brake: a client locked out is refused without a comparison."""
    configured_token = settings["app.admin_token"]
    if not configured_token:
        return None
    if len(configured_token) < MIN_TOKEN_CHARS:
        return (f"Control actions are off: the configured admin token is shorter than {MIN_TOKEN_CHARS} "
                "characters. Set a longer SS_APP_ADMIN_TOKEN and restart the console.")
    brake, client = get_token_brake(), client_id()
    wait_s = brake.wait_seconds(client)
    if wait_s > 0:
        return f"Too many wrong admin tokens; try again in {math.ceil(wait_s)} s. Nothing was done."
    right = console_math.token_matches(configured_token, typed_token)
    brake.record(right, client)
    return None if right else "The admin token is not right; nothing was done."


# ------------------------------------------------------------------ personal fields


def personal_fields_hidden(settings: Settings) -> bool:
    """Off loopback (``app.address``, or the address Streamlit really serves on, as app/main.py
    checks it), names, emails and raw payloads are masked until this browser session has given
    the admin token (:func:`render_personal_unlock`)."""
    if st.session_state.get("personal_unlocked"):
        return False
    return not is_loopback(settings["app.address"]) or not is_loopback(_served_address())


def _served_address() -> str | None:
    """The address Streamlit serves on; loopback under AppTest, whose runtime serves nothing."""
    from streamlit.runtime import Runtime

    if not Runtime.exists() or type(Runtime.instance()) is not Runtime:
        return "127.0.0.1"
    return st.get_option("server.address")


def mask_personal(frame: pd.DataFrame, settings: Settings | None = None) -> pd.DataFrame:
    """``frame`` with its personal columns (console_math.is_personal_column) masked, when
    :func:`personal_fields_hidden`; the same frame otherwise."""
    settings = settings or get_settings()
    if not personal_fields_hidden(settings):
        return frame
    columns = [name for name in frame.columns if console_math.is_personal_column(name)]
    if not columns:
        return frame
    masked = frame.copy()
    for name in columns:
        masked[name] = masked[name].map(console_math.mask_value).astype(object)
    return masked


def mask_personal_record(record: dict, settings: Settings) -> dict:
    """One record (e.g. a state look-up's latest version) with its personal fields masked, when hidden."""
    if not personal_fields_hidden(settings):
        return record
    return {name: console_math.mask_value(value) if console_math.is_personal_column(name) else value
            for name, value in record.items()}


def render_personal_unlock(settings: Settings) -> None:
    """In the sidebar, while personal fields are hidden: the admin token shows them to this session."""
    if not personal_fields_hidden(settings):
        return
    with st.sidebar:
        st.caption("Names, emails and raw payloads are masked for viewers off this machine.")
        typed = st.text_input("Admin token", type="password", key="personal_token")
        if st.button("Show personal fields", key="personal_unlock"):
            refused = check_admin_token(settings, typed)
            if refused:
                st.error(refused)
            else:
                st.session_state["personal_unlocked"] = True
                st.rerun()


def load_control():
    """The control module, imported when an action needs it so pages render without it."""
    return importlib.import_module("pipeline.control")


def render_confirmed_action(
    key: str,
    button_label: str,
    summary: str | Callable[[], str],
    perform: Callable[[], str],
    settings: Settings,
    disabled: bool = False,
) -> None:
    """A control button that acts only after confirmation, and the admin token if one is set.

    Clicking ``button_label`` opens a confirmation panel that repeats ``summary`` (what will
    happen; a callable is asked only when the panel opens, e.g. for a re-drive's plan); the action runs when the box is ticked, the token (if configured) matches and
    "Confirm" is pressed. ``perform`` returns the line to show on success; a
    StatefulStreamsError it raises is shown as an error. The token is never displayed.
    """
    pending, result = f"{key}_pending", f"{key}_result"
    if st.button(button_label, key=f"{key}_ask", disabled=disabled, icon=":material/play_arrow:"):
        st.session_state[pending] = True
        st.session_state.pop(result, None)
    if st.session_state.get(result):
        st.success(st.session_state[result], icon=":material/check_circle:")
    if not st.session_state.get(pending):
        return
    with st.container(border=True):
        try:
            summary = summary() if callable(summary) else summary
        except StatefulStreamsError as exc:
            st.error(str(exc))
            return
        st.warning(f"**Please confirm:** {summary}", icon=":material/help:")
        confirmed = st.checkbox("Yes, I want to do this", key=f"{key}_confirm")
        configured_token = settings["app.admin_token"]
        typed_token = st.text_input("Admin token", type="password", key=f"{key}_token") if configured_token else None
        confirm_column, cancel_column = st.columns(2)
        if cancel_column.button("Cancel", key=f"{key}_cancel"):
            st.session_state[pending] = False
            st.rerun()
        if not confirm_column.button("Confirm", key=f"{key}_do", type="primary"):
            return
        if not confirmed:
            st.error("Tick “Yes, I want to do this” first.")
            return
        refused = check_admin_token(settings, typed_token)
        if refused:
            st.error(refused)
            return
        try:
            message = perform()
        except ModuleNotFoundError as exc:
            st.error(f"The job's control functions are not available ({exc}); nothing was done.")
            return
        except StatefulStreamsError as exc:
            st.error(str(exc))
            return
        st.session_state[pending] = False
        st.session_state[result] = message
        st.rerun()
