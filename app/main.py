"""The console's entry point: it sets the page frame, refuses an unsafe bind, and routes to one file per screen."""

from pathlib import Path

import streamlit as st
from streamlit.runtime import Runtime

from app.resources import get_settings
from pipeline.console import check_console_access, is_loopback
from pipeline.errors import StatefulStreamsError

PAGES = Path(__file__).resolve().parent.parent / "pages"

st.set_page_config(page_title="Stateful Streams console", page_icon=":material/stream:", layout="wide")


def check_bind() -> None:
    """Check the address Streamlit really serves on (``--server.address`` may differ from the
    settings, and unset means every interface): off loopback, no tracebacks for viewers and a
    token is required. AppTest serves nothing (its runtime is a stand-in), so it is not checked."""
    if type(Runtime.instance()) is not Runtime:
        return
    address = st.get_option("server.address")
    if not is_loopback(address):
        st.set_option("client.showErrorDetails", "none")
    try:
        check_console_access(address, get_settings()["app.admin_token"])
    except StatefulStreamsError as exc:
        st.error(f"The console refuses to serve: {exc}", icon=":material/block:")
        st.stop()


check_bind()
navigation = st.navigation({
    "Watch": [
        st.Page(PAGES / "live_enrichment.py", title="Live enrichment", icon=":material/monitoring:", default=True),
        st.Page(PAGES / "backpressure.py", title="Backpressure", icon=":material/speed:"),
        st.Page(PAGES / "data_skew.py", title="Data skew", icon=":material/balance:"),
        st.Page(PAGES / "checkpoints.py", title="Checkpoints & savepoints", icon=":material/history:"),
        st.Page(PAGES / "storage.py", title="Storage", icon=":material/hard_drive:"),
    ],
    "Investigate and act": [
        st.Page(PAGES / "missing_state.py", title="Missing state", icon=":material/person_search:"),
        st.Page(PAGES / "replay.py", title="Replay", icon=":material/replay:"),
    ],
    "SQL": [
        st.Page(PAGES / "sql_pipelines.py", title="SQL pipelines", icon=":material/table_chart:"),
    ],
})
navigation.run()
