"""The console's DuckDB queries over the sinks: plain ``(connection, params) -> DataFrame`` functions.

Each function aggregates in DuckDB and returns a small frame, so a page never loads a whole
sink into pandas; windowed queries read only the files that can hold rows of their window,
and counts per time bucket come from the catalog, reading only files whose rows straddle a
bucket edge (:mod:`app.catalog`). ``connection`` is a DuckDB connection or cursor (one per
thread, see :func:`app.sources.connect`); ``data_dir`` is the job's data dir. Times come back as naive
UTC timestamps; ``*_ms`` columns are epoch milliseconds. A sink with no files reads as
empty. The metrics store has its own module, :mod:`app.metric_queries`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from app.catalog import SINK_TIME, catalog_for, count_by_bucket
from app.sources import Connection, files_relation, query_frame, sink_relation
from pipeline.enrich.lookups import LOOKUP_REASONS, LOOKUPS, lookups_missing

RATE_WINDOW_S = 60
# Per lookup (pipeline/enrich/lookups.py), by its name: the column holding its id, and which
# reasons mean it was missing: {"user": ("user_id", ("user", "user_and_item")), "item": …}.
ORDER_KEYS = {lookup.reason: lookup.id_column for lookup in LOOKUPS}
MISSING_KEYS = {lookup.reason: (lookup.id_column, tuple(reason for reason in LOOKUP_REASONS if lookup in lookups_missing(reason)))
                for lookup in LOOKUPS}
_IDS = ", ".join(ORDER_KEYS.values())  # user_id, item_id
# Event time: the time of the version each lookup decided an order with (NULL in processing time).
_AS_OF = ", ".join(f"CAST({{prefix}}{lookup.as_of_column} AS TIMESTAMP) AS {lookup.as_of_column}" for lookup in LOOKUPS)
LATENCY_MS = "(epoch_ms(enriched_at) - epoch_ms(published_at))"


def _frame_with(connection: Connection, tables: dict[str, pd.DataFrame], sql: str, params: dict[str, Any] | None = None) -> pd.DataFrame:
    """Run ``sql`` with small frames registered as tables for the duration of the query."""
    for name, frame in tables.items():
        connection.register(name, frame)
    try:
        return query_frame(connection, sql, params)
    finally:
        for name in tables:
            connection.unregister(name)


def _bucket(time_column: str, bucket_s: int) -> str:
    """SQL for the start of the ``bucket_s``-second bucket a row falls in, as a timestamp.

    Buckets are counted back from the window's end (``$end_ms``), so the newest one is as wide
    as the others and a rate per bucket does not dip at the right edge of a chart.
    """
    return f"epoch_ms({_bucket_ms(time_column, bucket_s)})"


def _bucket_ms(time_column: str, bucket_s: int) -> str:
    """:func:`_bucket` in epoch ms (as :func:`app.catalog.bucket_start_ms` computes it)."""
    width_ms = int(bucket_s) * 1000
    return f"($end_ms - (($end_ms - epoch_ms({time_column})) // {width_ms} + 1) * {width_ms})"


def _add_read_counts(connection: Connection, counts: dict, reads: list[str], params: dict[str, Any]) -> dict:
    """Add the ``(bucket ms, label, rows)`` rows of the ``reads`` queries (UNION ALL) to ``counts``."""
    if reads:
        for bucket_ms, label, rows in connection.execute(" UNION ALL ".join(reads), params).fetchall():
            counts[(bucket_ms, label)] = counts.get((bucket_ms, label), 0) + int(rows)
    return counts


def _bucket_frame(counts: dict, label: str, count: str) -> pd.DataFrame:
    """``{(bucket ms, label value): rows}`` as ``bucket_start`` (naive UTC), ``label, count``,
    ordered by bucket then label (a NULL label last)."""
    ordered = sorted(counts.items(), key=lambda item: (item[0][0], item[0][1] is None, item[0][1] or ""))
    frame = pd.DataFrame([(bucket_ms, value, rows) for (bucket_ms, value), rows in ordered],
                         columns=["bucket_ms", label, count])
    frame.insert(0, "bucket_start", pd.to_datetime(frame.pop("bucket_ms").astype("int64"), unit="ms").astype("datetime64[us]"))
    return frame.astype({label: "object", count: "int64"})


# ------------------------------------------------------------------------ live view


def load_sink_spans(connection: Connection, data_dir: Path) -> pd.DataFrame:
    """One row per sink from the catalog, reading no file: ``sink, rows, oldest_ms, newest_ms``.

    ``oldest_ms`` / ``newest_ms`` are the commit times of the sink's oldest and newest rows.
    """
    spans = []
    for sink in SINK_TIME:
        files = [entry for entry in catalog_for(data_dir).files(sink) if entry.rows]
        spans.append({
            "sink": sink, "rows": sum(entry.rows for entry in files),
            "oldest_ms": min((entry.min_ms for entry in files), default=None),
            "newest_ms": max((entry.max_ms for entry in files), default=None),
        })
    return pd.DataFrame(spans).astype({"rows": "int64", "oldest_ms": "Int64", "newest_ms": "Int64"})


def load_sink_totals(connection: Connection, data_dir: Path, now_ms: int) -> pd.DataFrame:
    """:func:`load_sink_spans` plus the rows of the last minute and that minute's rate.

    ``rows_last_minute`` counts rows committed in the 60 s up to ``now_ms``;
    ``rows_per_second`` is that count ÷ 60. Counted from the catalog: only a file with rows on
    both sides of the minute's start is read.
    """
    frame = load_sink_spans(connection, data_dir)
    last_minute = []
    window_ms = RATE_WINDOW_S * 1000
    for sink, column in SINK_TIME.items():
        counts, unread = count_by_bucket(catalog_for(data_dir).files(sink), int(now_ms), window_ms, window_ms)
        count = sum(counts.values())
        if unread:
            (read,) = connection.execute(
                f"SELECT count(*) FROM {files_relation(sink, unread)} WHERE epoch_ms({column}) > $now_ms - {window_ms} "
                f"AND epoch_ms({column}) <= $now_ms", {"now_ms": int(now_ms)}).fetchone()
            count += int(read)
        last_minute.append(count)
    frame.insert(2, "rows_last_minute", last_minute)
    frame["rows_per_second"] = frame["rows_last_minute"] / RATE_WINDOW_S
    return frame


def load_throughput(connection: Connection, data_dir: Path, window_end_ms: int, window_s: int, bucket_s: int) -> pd.DataFrame:
    """Rows committed per sink and time bucket in the window: ``bucket_start, sink, rows, rows_per_second``.

    Counted from the catalog; only files whose rows straddle a bucket edge are read.
    """
    params = {"end_ms": int(window_end_ms), "window_ms": int(window_s) * 1000}
    counts, reads = {}, []
    for sink, column in SINK_TIME.items():
        by_bucket, unread = count_by_bucket(catalog_for(data_dir).files(sink), params["end_ms"], params["window_ms"],
                                            int(bucket_s) * 1000)
        counts.update({(bucket_ms, sink): rows for bucket_ms, rows in by_bucket.items()})
        if unread:
            reads.append(f"""SELECT {_bucket_ms(column, bucket_s)}, '{sink}', count(*) FROM {files_relation(sink, unread)}
                WHERE epoch_ms({column}) > $end_ms - $window_ms AND epoch_ms({column}) <= $end_ms GROUP BY 1""")
    frame = _bucket_frame(_add_read_counts(connection, counts, reads, params), "sink", "rows")
    frame["rows_per_second"] = frame["rows"] / bucket_s
    return frame


def load_latency(connection: Connection, data_dir: Path, window_end_ms: int, window_s: int, bucket_s: int) -> pd.DataFrame:
    """End-to-end latency (published → enriched) over the window, in one pass.

    Columns ``scope, bucket_start, orders, p50_ms, p99_ms, max_ms``: one row with scope
    "window" (``bucket_start`` NULL) for the whole window, then one "bucket" row per bucket.
    Percentiles interpolate linearly between the two nearest orders (``quantile_cont``).
    """
    sql = f"""
        SELECT CASE WHEN grouping(bucket_start) = 1 THEN 'window' ELSE 'bucket' END AS scope, bucket_start,
               count(*) AS orders, quantile_cont(latency_ms, 0.5) AS p50_ms,
               quantile_cont(latency_ms, 0.99) AS p99_ms, max(latency_ms) AS max_ms
        FROM (
            SELECT {_bucket('enriched_at', bucket_s)} AS bucket_start, {LATENCY_MS} AS latency_ms
            FROM {sink_relation(data_dir, 'enriched', newer_than_ms=window_end_ms - window_s * 1000)}
            WHERE epoch_ms(enriched_at) > $end_ms - $window_ms AND epoch_ms(enriched_at) <= $end_ms
        )
        GROUP BY GROUPING SETS ((), (bucket_start))
        ORDER BY grouping(bucket_start) DESC, bucket_start"""
    return query_frame(connection, sql, {"end_ms": int(window_end_ms), "window_ms": int(window_s) * 1000})


def load_newest_enriched(connection: Connection, data_dir: Path, limit: int = 20) -> pd.DataFrame:
    """The newest enriched orders with the user and item they were enriched with (and, in event
    time, the times of those versions: ``user_as_of``, ``item_as_of``; NULL in processing time)."""
    sql = f"""
        SELECT CAST(enriched_at AS TIMESTAMP) AS enriched_at, invoice_id, line_item_id,
               user_id, user_first_name || ' ' || user_last_name AS user_name, user_email,
               item_id, item_name, item_category, price, waited_ms,
               {LATENCY_MS} AS latency_ms, batch_id, source_message_id, {_AS_OF.format(prefix="")}
        FROM {sink_relation(data_dir, 'enriched', newest_rows=limit)}
        ORDER BY enriched_at DESC, invoice_id DESC, line_item_id DESC
        LIMIT $limit"""
    return query_frame(connection, sql, {"limit": int(limit)})


# ---------------------------------------------------------------------- missing state


def load_missing_orders(
    connection: Connection,
    data_dir: Path,
    invoice_id: int | None = None,
    limit: int = 200,
    **ids: int | None,
) -> pd.DataFrame:
    """Missing-state orders matching every id given (newest first; ``ids`` by the lookups' id
    columns: ``user_id``, ``item_id``), and what happened since.

    ``user_seen_at`` / ``item_seen_at`` (one per lookup): the earliest ``enriched_at`` after the
    order's ``detected_at`` of an enriched order with the same user / item, i.e. when that key
    appeared in state; NULL if it has not appeared yet. ``redrive_enriched_at`` and
    ``redrive_missing_at`` say what became of a re-drive of this order, if any.
    """
    unknown = set(ids) - set(ORDER_KEYS.values())
    if unknown:
        raise TypeError(f"load_missing_orders() got unknown ids {sorted(unknown)!r}; expected {list(ORDER_KEYS.values())}")
    keys = {column: ids.get(column) for column in ORDER_KEYS.values()}
    searching = invoice_id is not None or any(value is not None for value in keys.values())
    key_filters = "".join(f"\n          AND (${column} IS NULL OR {column} = ${column})" for column in keys)
    picked = query_frame(connection, f"""
        SELECT epoch_ms(detected_at) AS detected_ms, *
        FROM {sink_relation(data_dir, 'missing_state', newest_rows=None if searching else limit)}
        WHERE ($invoice_id IS NULL OR invoice_id = $invoice_id){key_filters}
        ORDER BY detected_at DESC, invoice_id DESC, line_item_id DESC LIMIT $limit""",
        {"invoice_id": invoice_id, **keys, "limit": int(limit)})
    picked.insert(0, "row_key", range(len(picked)))
    # Everything that can answer "what happened since" was committed after the oldest pick,
    # and one pass over those enriched files finds it all.
    since_ms = int(picked["detected_ms"].min()) - 1 if not picked.empty else None
    later = "".join(f"""
        later_{key} AS (
            SELECT p.row_key, min(h.enriched_at) AS seen_at FROM picked p
            JOIN hits h ON h.{column} = p.{column} AND h.enriched_at > p.detected_at GROUP BY 1
        ),""" for key, column in ORDER_KEYS.items())
    sql = f"""
        WITH hits AS (
            SELECT {_IDS}, enriched_at, redrive_of
            FROM {sink_relation(data_dir, "enriched", newer_than_ms=since_ms)}
            WHERE {" OR ".join(f"{column} IN (SELECT {column} FROM picked)" for column in ORDER_KEYS.values())}
               OR (redrive_of IS NOT NULL AND redrive_of IN (SELECT source_message_id FROM picked))
        ),{later}
        redrive_enriched AS (SELECT redrive_of, min(enriched_at) AS at FROM hits WHERE redrive_of IS NOT NULL GROUP BY 1),
        redrive_missing AS (
            SELECT redrive_of, max(detected_at) AS at
            FROM {sink_relation(data_dir, "missing_state", newer_than_ms=since_ms)}
            WHERE redrive_of IN (SELECT source_message_id FROM picked) GROUP BY 1
        )
        SELECT CAST(p.detected_at AS TIMESTAMP) AS detected_at, p.invoice_id, p.line_item_id,
               {", ".join(f"p.{column}" for column in ORDER_KEYS.values())}, p.item_name, p.price, p.reason, p.waited_ms,
               {", ".join(f"CAST(later_{key}.seen_at AS TIMESTAMP) AS {key}_seen_at" for key in ORDER_KEYS)},
               CAST(re.at AS TIMESTAMP) AS redrive_enriched_at, CAST(rm.at AS TIMESTAMP) AS redrive_missing_at,
               p.redrive_of, p.source_message_id, CAST(p.created_at AS TIMESTAMP) AS created_at,
               {_AS_OF.format(prefix="p.")}
        FROM picked p
        {" ".join(f"LEFT JOIN later_{key} ON later_{key}.row_key = p.row_key" for key in ORDER_KEYS)}
        LEFT JOIN redrive_enriched re ON re.redrive_of = p.source_message_id
        LEFT JOIN redrive_missing rm ON rm.redrive_of = p.source_message_id
        ORDER BY p.row_key"""
    return _frame_with(connection, {"picked": picked}, sql)


def load_missing_totals(connection: Connection, data_dir: Path) -> pd.DataFrame:
    """Missing-state orders per reason over the whole sink: ``reason, orders`` (from the catalog)."""
    totals: dict[str, int] = {}
    for entry in catalog_for(data_dir).files("missing_state"):
        for reason, rows in entry.rows_by_group:
            totals[reason] = totals.get(reason, 0) + rows
    frame = pd.DataFrame(sorted(totals.items(), key=lambda item: (-item[1], item[0])), columns=["reason", "orders"])
    return frame.astype({"orders": "int64"})


def load_missing_by_reason(connection: Connection, data_dir: Path, window_end_ms: int, window_s: int, bucket_s: int) -> pd.DataFrame:
    """Missing-state orders per reason and time bucket: ``bucket_start, reason, orders``.

    Counted from the catalog's rows per reason; only files whose rows straddle a bucket edge
    are read.
    """
    params = {"end_ms": int(window_end_ms), "window_ms": int(window_s) * 1000}
    counts, unread = count_by_bucket(catalog_for(data_dir).files("missing_state"), params["end_ms"],
                                     params["window_ms"], int(bucket_s) * 1000, by_group=True)
    reads = [f"""SELECT {_bucket_ms('detected_at', bucket_s)}, reason, count(*) FROM {files_relation('missing_state', unread)}
        WHERE epoch_ms(detected_at) > $end_ms - $window_ms AND epoch_ms(detected_at) <= $end_ms GROUP BY 1, 2"""] if unread else []
    return _bucket_frame(_add_read_counts(connection, counts, reads, params), "reason", "orders")


def load_top_missing_keys(connection: Connection, data_dir: Path, window_end_ms: int, window_s: int,
                          limit: int = 10) -> pd.DataFrame:
    """The users and items most often missing in the window, ``limit`` of each, in one pass.

    Columns ``key`` ("user" / "item"), ``key_id, missing_orders, last_detected_at,
    seen_since_at``; ``seen_since_at`` is the earliest enriched order for that key after its
    last miss (at any time up to now). An order missing both counts for its user and its item.
    """
    since_window_ms = int(window_end_ms) - int(window_s) * 1000
    per_key = " UNION ALL ".join(
        f"""(SELECT '{key}' AS key, {column} AS key_id, count(*) AS missing_orders,
                    max(detected_at) AS last_detected_at, max(epoch_ms(detected_at)) AS last_detected_ms
             FROM missing WHERE reason IN ({", ".join(f"'{reason}'" for reason in reasons)})
             GROUP BY 2 ORDER BY missing_orders DESC, key_id LIMIT $limit)"""
        for key, (column, reasons) in MISSING_KEYS.items()
    )
    top = query_frame(connection, f"""
        WITH missing AS MATERIALIZED (
            SELECT {_IDS}, reason, detected_at
            FROM {sink_relation(data_dir, 'missing_state', newer_than_ms=since_window_ms)}
            WHERE epoch_ms(detected_at) > $since_ms AND epoch_ms(detected_at) <= $end_ms)
        {per_key}""", {"limit": int(limit), "since_ms": since_window_ms, "end_ms": int(window_end_ms)})
    since_ms = int(top["last_detected_ms"].min()) - 1 if not top.empty else None
    sql = f"""
        WITH hits AS (
            SELECT {_IDS}, enriched_at
            FROM {sink_relation(data_dir, 'enriched', newer_than_ms=since_ms)}
            WHERE {" OR ".join(f"{column} IN (SELECT key_id FROM top WHERE key = '{key}')" for key, column in ORDER_KEYS.items())}
        ),
        seen AS (
            SELECT t.key, t.key_id, min(h.enriched_at) AS seen_since_at
            FROM top t JOIN hits h
              ON (CASE t.key {" ".join(f"WHEN '{key}' THEN h.{column}" for key, column in ORDER_KEYS.items())} END) = t.key_id
             AND h.enriched_at > t.last_detected_at
            GROUP BY 1, 2
        )
        SELECT t.key, t.key_id, t.missing_orders, CAST(t.last_detected_at AS TIMESTAMP) AS last_detected_at,
               CAST(s.seen_since_at AS TIMESTAMP) AS seen_since_at
        FROM top t LEFT JOIN seen s USING (key, key_id)
        ORDER BY t.key DESC, t.missing_orders DESC, t.key_id"""
    return _frame_with(connection, {"top": top}, sql)


# ------------------------------------------------------------------------------ skew


def load_key_load(connection: Connection, data_dir: Path, window_end_ms: int, window_s: int,
                  limit: int = 10, top_fraction: float = 0.01) -> pd.DataFrame:
    """Orders per user id and per item id (enriched and missing) committed in the window.

    Returns the ``limit`` hottest users and items as ``key`` ("user" / "item"), ``key_id,
    orders, share``, hottest first; every row also carries ``total_keys, total_orders`` and
    ``top_keys, top_orders, top_share`` of its key: how many ids make the top
    ``top_fraction`` (at least one) and the share of all orders they hold.
    """
    since_ms = int(window_end_ms) - int(window_s) * 1000
    in_window = "epoch_ms({time}) > $since_ms AND epoch_ms({time}) <= $end_ms"

    def ranked(key: str) -> str:
        return f"""(
            WITH counts AS (SELECT {ORDER_KEYS[key]} AS key_id, count(*) AS orders FROM orders GROUP BY 1),
            ranked AS (
                SELECT key_id, orders, row_number() OVER (ORDER BY orders DESC, key_id) AS rank,
                       count(*) OVER () AS total_keys, CAST(sum(orders) OVER () AS BIGINT) AS total_orders
                FROM counts
            ),
            spread AS (SELECT greatest(1, CAST(ceil(any_value(total_keys) * $fraction) AS BIGINT)) AS top_keys FROM ranked),
            top_total AS (SELECT CAST(sum(orders) AS BIGINT) AS top_orders FROM ranked, spread WHERE rank <= top_keys)
            SELECT '{key}' AS key, key_id, orders, orders / total_orders AS share, total_keys, total_orders,
                   top_keys, top_orders, top_orders / total_orders AS top_share, rank
            FROM ranked, spread, top_total WHERE rank <= $limit)"""

    sql = f"""
        WITH orders AS MATERIALIZED (
            SELECT {_IDS} FROM {sink_relation(data_dir, 'enriched', newer_than_ms=since_ms)}
            WHERE {in_window.format(time='enriched_at')}
            UNION ALL
            SELECT {_IDS} FROM {sink_relation(data_dir, 'missing_state', newer_than_ms=since_ms)}
            WHERE {in_window.format(time='detected_at')}
        )
        SELECT * EXCLUDE (rank) FROM ({" UNION ALL ".join(ranked(key) for key in ORDER_KEYS)}) ORDER BY key DESC, rank"""
    return query_frame(connection, sql, {"limit": int(limit), "fraction": float(top_fraction),
                                    "since_ms": since_ms, "end_ms": int(window_end_ms)})
