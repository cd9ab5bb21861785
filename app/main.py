"""The console's entry point: it sets the page frame and routes to one file per screen."""

from pathlib import Path

import streamlit as st

PAGES = Path(__file__).resolve().parent.parent / "pages"

st.set_page_config(page_title="Stateful Streams console", page_icon=":material/stream:", layout="wide")
navigation = st.navigation({
    "Watch": [
        st.Page(PAGES / "live_enrichment.py", title="Live enrichment", icon=":material/monitoring:", default=True),
        st.Page(PAGES / "backpressure.py", title="Backpressure", icon=":material/speed:"),
        st.Page(PAGES / "data_skew.py", title="Data skew", icon=":material/balance:"),
        st.Page(PAGES / "checkpoints.py", title="Checkpoints & savepoints", icon=":material/history:"),
    ],
    "Investigate and act": [
        st.Page(PAGES / "missing_state.py", title="Missing state", icon=":material/person_search:"),
        st.Page(PAGES / "replay.py", title="Replay", icon=":material/replay:"),
    ],
})
navigation.run()
