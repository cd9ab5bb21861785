"""The console's per-process resources: the settings, the DuckDB connection and cached queries.

Streamlit runs each browser session in its own thread. The settings and one DuckDB
connection are shared by all of them (``st.cache_resource``); every query runs on its own
``.cursor()`` of that connection, as DuckDB's threading guide asks. Query results are cached
for :data:`REFRESH_SECONDS`, the interval at which the live fragments rerun, so viewers
watching the same page share one query and no chart is staler than one refresh.
"""

from __future__ import annotations

import importlib
import time
from typing import Callable

import duckdb
import pandas as pd
import streamlit as st

from app import sources
from pipeline.config import Settings, load_settings

REFRESH_SECONDS = 2


@st.cache_resource(show_spinner=False)
def get_settings() -> Settings:
    """The settings from the environment (``SS_*``, set by ``python -m pipeline app``), loaded once."""
    return load_settings()


# The connection caches each Parquet file's footer (app/sources.py), also for the files compaction
# has since replaced, and DuckDB keeps that cache up to its memory limit (80% of the RAM): the
# exporter's grew 2.6 MB a minute at 2,000 orders/s (bench/README.md, issue 28). A new connection
# every hour starts an empty cache: the console holds at most an hour of replaced files' footers.
CONNECTION_TTL_S = 3600


@st.cache_resource(show_spinner=False, ttl=CONNECTION_TTL_S)
def get_connection() -> duckdb.DuckDBPyConnection:
    """The DuckDB connection of this process (a new one every :data:`CONNECTION_TTL_S`); use a
    cursor of it per query."""
    return sources.connect()


def fetch(query: Callable[..., pd.DataFrame], **params) -> pd.DataFrame:
    """Run a query of :mod:`app.queries` or :mod:`app.metric_queries` with keyword ``params``,
    cached for one refresh interval."""
    return _run_cached(query.__module__, query.__name__, tuple(sorted(params.items())))


@st.cache_data(ttl=REFRESH_SECONDS, show_spinner=False, max_entries=512)
def _run_cached(module_name: str, query_name: str, params: tuple) -> pd.DataFrame:
    query = getattr(importlib.import_module(module_name), query_name)
    with get_connection().cursor() as cursor:
        return query(cursor, **dict(params))


def now_ms() -> int:
    """The wall clock in epoch milliseconds."""
    return int(time.time() * 1000)


def refresh_tick_ms() -> int:
    """The wall clock rounded down to the refresh interval: a cache key that viewers share."""
    step = REFRESH_SECONDS * 1000
    return now_ms() // step * step
