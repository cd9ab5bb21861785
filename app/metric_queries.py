"""The console's DuckDB queries over the metrics store: plain ``(connection, params) -> DataFrame`` functions.

The store is the job's JSON Lines of ``progress`` (one row per micro-batch), ``tasks`` (one
row per task of each stateful stage) and ``events`` (DESIGN.md §6); :mod:`app.sources` reads
them, skipping a half-written last line. ``connection`` is a DuckDB connection or cursor;
``data_dir`` is the job's data dir. Times come back as naive UTC timestamps; ``*_ms``
columns are epoch milliseconds. A store with no files reads as empty.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from app.console_math import LIFECYCLE_KINDS, compute_backlog
from app.sources import (DURATION_PHASES, METRIC_COLUMNS, Connection, empty_relation, metrics_relation, newest_metrics, query_frame,
                         query_newest, sql_text)
from pipeline import store
from pipeline.enrich.lookups import LOOKUPS

DAY_MS = 86_400_000
CENSUS_ROWS = 16 * len(LOOKUPS)  # the newest state rows read: several censuses of every lookup


TASKS_PER_BATCH = 16  # a first guess of the task rows per batch; the read grows until it holds enough batches


def load_recent_tasks(connection: Connection, data_dir: Path, batches: int = 20) -> pd.DataFrame:
    """Task rows of the newest ``batches`` batches: ``batch_id, stage, stage_id, task, records, duration_ms``."""
    lines = int(batches) * TASKS_PER_BATCH
    while True:
        with newest_metrics(connection, data_dir, "tasks", lines) as (tasks, whole):
            sql = f"""
                WITH recent AS (SELECT DISTINCT batch_id FROM {tasks} ORDER BY batch_id DESC LIMIT $batches)
                SELECT batch_id, stage, stage_id, task, records, duration_ms
                FROM {tasks} WHERE batch_id IN (SELECT batch_id FROM recent)
                ORDER BY batch_id, stage, task"""
            frame = query_frame(connection, sql, {"batches": int(batches)})
        # The oldest batch read may be cut short: it counts only with one more batch before it.
        if whole or frame["batch_id"].nunique() > int(batches) or \
                (frame["batch_id"].nunique() == int(batches) and len(frame) < lines):
            return frame
        lines *= 4


def load_partition_rows(connection: Connection, data_dir: Path, batches: int = 100) -> pd.DataFrame:
    """Rows read per source topic and partition over the newest ``batches`` batches."""
    sql = f"""
        WITH recent AS (SELECT topics FROM {{newest}} ORDER BY ts_ms DESC LIMIT $batches),
        per_topic AS (SELECT unnest(topics) AS t FROM recent),
        per_partition AS (SELECT t.topic AS topic, unnest(t.partitions) AS p FROM per_topic)
        SELECT topic, CAST(p."partition" AS INTEGER) AS "partition", CAST(sum(p."rows") AS BIGINT) AS "rows"
        FROM per_partition GROUP BY 1, 2 ORDER BY 1, 2"""
    return query_newest(connection, data_dir, "progress", batches, sql, {"batches": int(batches)})


# ----------------------------------------------------------------- batches (progress)

_PHASE_COLUMNS = ", ".join(f'duration_ms."{phase}" AS "{phase}_ms"' for phase in DURATION_PHASES)
# The messages a batch read from the topics read after the changelogs (the orders), exact;
# NULL if one of them was not counted.
_AFTER_CHANGELOGS = ("list_filter(topics, lambda t: NOT list_contains(["
                     + ", ".join(sql_text(lookup.changelog) for lookup in LOOKUPS) + "], t.topic))")
_ORDERS_ROWS = (f'CASE WHEN list_bool_or(list_transform({_AFTER_CHANGELOGS}, lambda t: t."rows" IS NULL)) THEN NULL '
                f'ELSE CAST(coalesce(list_sum(list_transform({_AFTER_CHANGELOGS}, lambda t: t."rows")), 0) AS BIGINT) END')
_ROCKSDB_COMMIT_MS = (
    "list_sum(list_transform(state, lambda s: coalesce(list_sum(list_transform(map_entries(s.custom), "
    "lambda e: CASE WHEN e.key LIKE 'rocksdbCommit%Latency%' THEN e.value ELSE 0.0 END)), 0.0)))"
)


def load_batches(connection: Connection, data_dir: Path, limit: int = 300) -> pd.DataFrame:
    """The newest ``limit`` progress rows (one per micro-batch), oldest first.

    Columns: ``batch_id, ts_ms, trigger_time, num_input_rows, input_rows_per_second,
    processed_rows_per_second, trigger_interval_ms, batch_duration_ms``, one ``<phase>_ms``
    per duration phase, the state summed over operators (``state_rows, state_rows_updated,
    state_memory_bytes, state_commit_ms, rocksdb_commit_ms`` = the sum of the RocksDB commit
    phases ``rocksdbCommit*Latency*``: flush, compact, checkpoint, file sync), ``state_size_bytes``
    and the rows each sink got; whether the planner held the orders back for the changelogs
    (``orders_held``), gave them a share anyway (``orders_shared``), how many batches in a row the
    changelogs had filled the cap (``orders_held_for``; all three NULL in rows from before the
    planner said), and the orders read (``orders_rows``, exact).
    """
    sql = f"""
        SELECT * FROM (
            SELECT batch_id, ts_ms, epoch_ms(ts_ms) AS trigger_time, num_input_rows,
                   input_rows_per_second, processed_rows_per_second, trigger_interval_ms,
                   batch_duration_ms, {_PHASE_COLUMNS},
                   orders_held, orders_shared, orders_held_for, {_ORDERS_ROWS} AS orders_rows,
                   CAST(list_sum(list_transform(state, lambda s: s.rows_total)) AS BIGINT) AS state_rows,
                   CAST(list_sum(list_transform(state, lambda s: s.rows_updated)) AS BIGINT) AS state_rows_updated,
                   CAST(list_sum(list_transform(state, lambda s: s.memory_bytes)) AS BIGINT) AS state_memory_bytes,
                   CAST(list_sum(list_transform(state, lambda s: s.commit_ms)) AS BIGINT) AS state_commit_ms,
                   CAST({_ROCKSDB_COMMIT_MS} AS DOUBLE) AS rocksdb_commit_ms,
                   state_size_bytes,
                   sink_rows.enriched AS enriched_rows, sink_rows.missing_state AS missing_rows,
                   sink_rows.dead_letter AS dead_letter_rows
            FROM {{newest}}
            ORDER BY ts_ms DESC LIMIT $limit
        ) ORDER BY ts_ms"""
    return query_newest(connection, data_dir, "progress", limit, sql, {"limit": int(limit)})


def load_state_by_operator(connection: Connection, data_dir: Path) -> pd.DataFrame:
    """The state of each operator in the newest batch: ``operator, rows_total, memory_bytes, commit_ms``."""
    sql = """
        WITH newest AS (SELECT state FROM {newest} ORDER BY ts_ms DESC LIMIT 1),
        operators AS (SELECT unnest(state) AS s FROM newest)
        SELECT s.operator AS operator, s.rows_total AS rows_total, s.memory_bytes AS memory_bytes,
               s.commit_ms AS commit_ms
        FROM operators ORDER BY operator"""
    return query_newest(connection, data_dir, "progress", 1, sql)


def load_lookup_state(connection: Connection, data_dir: Path) -> pd.DataFrame:
    """The newest census of each lookup: ``lookup, batch_id, ts_ms, keys_held, waiting_keys,
    waiting_orders`` (keys held and orders waiting, from Spark's state metrics and state store)."""
    sql = """
        SELECT lookup, arg_max(batch_id, ts_ms) AS batch_id, max(ts_ms) AS ts_ms,
               arg_max(keys_held, ts_ms) AS keys_held, arg_max(waiting_keys, ts_ms) AS waiting_keys,
               arg_max(waiting_orders, ts_ms) AS waiting_orders
        FROM {newest} GROUP BY lookup ORDER BY lookup"""
    # Each census writes one row per lookup: its newest rows hold every lookup's newest census.
    return query_newest(connection, data_dir, "state", CENSUS_ROWS, sql)


def load_backlog(connection: Connection, data_dir: Path, limit: int = 300) -> pd.DataFrame:
    """Per topic and batch over the newest ``limit`` batches: positions, the backlog and what the
    planner admitted.

    Columns ``ts_ms, trigger_time, batch_id, topic, generation, rows, end_position,
    latest_position, backlog`` (see :func:`app.console_math.compute_backlog`), ``admitted_messages,
    admitted_bytes`` (the planner's estimates; NULL where its offsets did not say), oldest first.
    """
    sql = f"""
        WITH recent AS (SELECT ts_ms, batch_id, topics FROM {{newest}} ORDER BY ts_ms DESC LIMIT $limit),
        per_topic AS (SELECT ts_ms, batch_id, unnest(topics) AS t FROM recent)
        SELECT ts_ms, epoch_ms(ts_ms) AS trigger_time, batch_id, t.topic AS topic,
               t.generation AS generation, t."rows" AS "rows", t.end_position AS end_position,
               t.latest_position AS latest_position, t.backlog AS reported_backlog,
               t.admitted_messages AS admitted_messages, t.admitted_bytes AS admitted_bytes
        FROM per_topic ORDER BY ts_ms, topic"""
    frame = query_newest(connection, data_dir, "progress", limit, sql, {"limit": int(limit)})
    frame["backlog"] = pd.array(
        [
            compute_backlog(end, latest, reported)
            for end, latest, reported in zip(frame["end_position"], frame["latest_position"], frame["reported_backlog"])
        ],
        dtype="Int64",
    )
    return frame.drop(columns=["reported_backlog"])


def load_watermarks(connection: Connection, data_dir: Path) -> pd.DataFrame:
    """Event time: each topic's watermark in the newest batch (the least of its partitions'), its
    lag behind the newest event time read from any topic, whether it is idle, and the late
    changelog versions counted over every batch; with the job's watermark (the least of the
    changelogs', or a later one when a partition is idle). Empty in processing time.

    Columns ``batch_id, trigger_time, job_watermark, topic, newest, watermark, lag_ms, idle,
    late_versions``.
    """
    relation = metrics_relation(data_dir, 'watermarks')
    sql = f"""
        WITH newest AS (SELECT ts_ms, batch_id, watermark_ms, topics FROM {{newest}} ORDER BY ts_ms DESC LIMIT 1),
        per_topic AS (SELECT ts_ms, batch_id, watermark_ms, unnest(topics) AS t FROM newest),
        late AS (SELECT t.topic AS topic, sum(t.late_versions) AS late_versions
                 FROM (SELECT unnest(topics) AS t FROM {relation}) GROUP BY t.topic)
        SELECT batch_id, epoch_ms(ts_ms) AS trigger_time,
               CASE WHEN watermark_ms IS NOT NULL THEN epoch_ms(watermark_ms) END AS job_watermark, t.topic AS topic,
               CASE WHEN t.newest_ms IS NOT NULL THEN epoch_ms(t.newest_ms) END AS newest,
               CASE WHEN t.watermark_ms IS NOT NULL THEN epoch_ms(t.watermark_ms) END AS watermark,
               t.lag_ms AS lag_ms, t.idle AS idle, CAST(late.late_versions AS BIGINT) AS late_versions
        FROM per_topic LEFT JOIN late ON late.topic = t.topic ORDER BY t.topic"""
    return query_newest(connection, data_dir, "watermarks", 1, sql)


def load_partition_watermarks(connection: Connection, data_dir: Path) -> pd.DataFrame:
    """Event time: the watermark of each partition of each partitioned topic in the newest batch
    (empty when no topic has several partitions).

    Columns ``topic, partition, newest, watermark, idle``.
    """
    sql = """
        WITH newest AS (SELECT ts_ms, topics FROM {newest} ORDER BY ts_ms DESC LIMIT 1),
        per_topic AS (SELECT unnest(topics) AS t FROM newest),
        parts AS (SELECT t.topic AS topic, unnest(t.partitions) AS p FROM per_topic)
        SELECT topic, p.partition AS partition,
               CASE WHEN p.newest_ms IS NOT NULL THEN epoch_ms(p.newest_ms) END AS newest,
               CASE WHEN p.watermark_ms IS NOT NULL THEN epoch_ms(p.watermark_ms) END AS watermark, p.idle AS idle
        FROM parts ORDER BY topic, partition"""
    return query_newest(connection, data_dir, "watermarks", 1, sql)


def load_progress_totals(connection: Connection, data_dir: Path) -> pd.DataFrame:
    """Sums over every retained progress row: ``batches, last_batch_id`` and rows per sink. A
    full recount that reads every day file: the exporter keeps running totals instead
    (:mod:`app.store_totals`); this is what they are checked against."""
    sql = f"""
        SELECT count(*) AS batches, max(batch_id) AS last_batch_id,
               CAST(coalesce(sum(sink_rows.enriched), 0) AS BIGINT) AS enriched_rows,
               CAST(coalesce(sum(sink_rows.missing_state), 0) AS BIGINT) AS missing_rows,
               CAST(coalesce(sum(sink_rows.dead_letter), 0) AS BIGINT) AS dead_letter_rows
        FROM {metrics_relation(data_dir, 'progress')}"""
    return query_frame(connection, sql)


def load_topic_positions(connection: Connection, data_dir: Path, topic: str, since_ms: int) -> pd.DataFrame:
    """A topic's positions in every batch from ``since_ms`` on.

    Columns ``ts_ms, batch_id, generation, rows, end_position, latest_position``, oldest first.
    """
    sql = f"""
        WITH per_topic AS (SELECT ts_ms, batch_id, unnest(topics) AS t
                           FROM {metrics_relation(data_dir, 'progress', since_ms=since_ms)} WHERE ts_ms >= $since_ms)
        SELECT ts_ms, batch_id, t.generation AS generation, t."rows" AS "rows", t.end_position AS end_position,
               t.latest_position AS latest_position
        FROM per_topic WHERE t.topic = $topic ORDER BY ts_ms"""
    return query_frame(connection, sql, {"topic": topic, "since_ms": int(since_ms)})


# -------------------------------------------------------------------------- events


def load_events(connection: Connection, data_dir: Path, kinds: tuple[str, ...] | None = None, limit: int = 200) -> pd.DataFrame:
    """The newest events (newest first): ``ts_ms, time, kind, message, details`` (a dict)."""
    kind_filter = "kind IN (SELECT unnest($kinds))" if kinds else "true"
    sql = f"""
        SELECT ts_ms, epoch_ms(ts_ms) AS time, kind, message, CAST(details AS VARCHAR) AS details
        FROM {metrics_relation(data_dir, 'events')}
        WHERE {kind_filter} ORDER BY ts_ms DESC LIMIT $limit"""
    params: dict[str, Any] = {"limit": int(limit)}
    if kinds:
        params["kinds"] = list(kinds)
    frame = query_frame(connection, sql, params)
    frame["details"] = [json.loads(text) if isinstance(text, str) else {} for text in frame["details"]]
    return frame


def load_latest_lifecycle_event(connection: Connection, data_dir: Path) -> pd.DataFrame:
    """The newest of job_started / restart / job_failed / job_stopped, as a one-row frame."""
    return load_events(connection, data_dir, kinds=LIFECYCLE_KINDS, limit=1)


def read_heartbeat(data_dir: Path) -> int | None:
    """When the job last said it runs with nothing to read (``store.heartbeat_path``), in epoch
    ms; None when it never did, or the file cannot be read."""
    try:
        return int(json.loads(store.heartbeat_path(data_dir).read_text())["ts_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_event_counts(connection: Connection, data_dir: Path) -> pd.DataFrame:
    """Events of each kind over the whole store: ``kind, events``."""
    sql = f"SELECT kind, count(*) AS events FROM {metrics_relation(data_dir, 'events')} GROUP BY 1 ORDER BY 1"
    return query_frame(connection, sql)


def load_replays(connection: Connection, data_dir: Path) -> pd.DataFrame:
    """One row per replay ``seq``, newest first, from its requested / started / finished events.

    Columns: ``seq, topic, from_position, requested_by, requested_at, started_ms, started_at,
    target_position, finished_at, messages, duration_ms``; a stage that has not happened is NULL.
    """
    events = metrics_relation(data_dir, "events")

    def stage(kind: str, columns: str) -> str:
        return f"""SELECT CAST(details->>'$.seq' AS BIGINT) AS seq, details->>'$.topic' AS topic,
                          ts_ms, {columns}
                   FROM {events} WHERE kind = '{kind}'
                   QUALIFY row_number() OVER (PARTITION BY seq ORDER BY ts_ms DESC) = 1"""

    sql = f"""
        WITH requested AS ({stage('replay_requested', "details->>'$.from' AS from_position, details->>'$.requested_by' AS requested_by")}),
        started AS ({stage('replay_started', "details->>'$.from' AS from_position, CAST(details->>'$.target_position' AS BIGINT) AS target_position")}),
        finished AS ({stage('replay_finished', "CAST(details->>'$.messages' AS BIGINT) AS messages, CAST(details->>'$.duration_ms' AS BIGINT) AS duration_ms")})
        SELECT coalesce(r.seq, s.seq, f.seq) AS seq, coalesce(r.topic, s.topic, f.topic) AS topic,
               coalesce(r.from_position, s.from_position) AS from_position, r.requested_by,
               epoch_ms(r.ts_ms) AS requested_at, s.ts_ms AS started_ms, epoch_ms(s.ts_ms) AS started_at,
               s.target_position, epoch_ms(f.ts_ms) AS finished_at, f.messages, f.duration_ms
        FROM requested r
        FULL OUTER JOIN started s ON s.seq = r.seq
        FULL OUTER JOIN finished f ON f.seq = coalesce(r.seq, s.seq)
        ORDER BY seq DESC"""
    return query_frame(connection, sql)


def load_order_shares(connection: Connection, data_dir: Path) -> pd.DataFrame:
    """One row per run of batches in which the orders got a share while the changelogs filled the
    batch cap, newest first, from its ``orders_share_started`` / ``orders_share_ended`` events.

    Columns: ``started_batch, started_at, ended_at, last_batch, batches, held_for, orders,
    open``. ``orders`` are the orders admitted in the run's batches (exact): the end event's
    count, or for the run still open, the orders read so far in the shared batches since its
    first (each batch once). NULL when a batch was not counted. ``held_for``: the most batches
    in a row the changelogs filled the cap.
    """
    events = metrics_relation(data_dir, "events")
    runs = f"""
        WITH started AS (
            SELECT ts_ms, CAST(details->>'$.batch_id' AS BIGINT) AS started_batch,
                   CAST(details->>'$.held_for' AS BIGINT) AS held_for
            FROM {events} WHERE kind = 'orders_share_started'),
        ended AS (
            SELECT ts_ms, CAST(details->>'$.started_batch' AS BIGINT) AS started_batch,
                   CAST(details->>'$.last_batch' AS BIGINT) AS last_batch, CAST(details->>'$.batches' AS BIGINT) AS batches,
                   CAST(details->>'$.held_for' AS BIGINT) AS held_for, CAST(details->>'$.orders' AS BIGINT) AS orders
            FROM {events} WHERE kind = 'orders_share_ended'),
        runs AS (
            SELECT s.ts_ms, s.started_batch, s.held_for AS held_at_start, e.ts_ms AS ended_ms, e.last_batch,
                   e.batches, e.held_for, e.orders
            FROM started s LEFT JOIN ended e ON e.started_batch = s.started_batch AND e.ts_ms >= s.ts_ms
            QUALIFY row_number() OVER (PARTITION BY s.ts_ms, s.started_batch ORDER BY e.ts_ms NULLS LAST) = 1),
        open_run AS (SELECT * FROM runs WHERE ended_ms IS NULL ORDER BY ts_ms DESC LIMIT 1)"""
    # Only the open run needs progress rows: those from the day before its start event on.
    (open_ms,) = connection.execute(f"{runs} SELECT max(ts_ms) FROM open_run").fetchone()
    progress = empty_relation(METRIC_COLUMNS["progress"]) if open_ms is None else \
        metrics_relation(data_dir, "progress", since_ms=int(open_ms) - DAY_MS)
    sql = f"""{runs},
        -- the open run's batches: from its first batch's progress row (the newest one before the start event) on
        since AS (SELECT max(p.ts_ms) AS from_ms FROM {progress} p, open_run r
                  WHERE p.batch_id = r.started_batch AND p.ts_ms <= r.ts_ms),
        shared AS (SELECT p.batch_id, arg_max(p.orders_shared, p.ts_ms) AS orders_shared,
                          arg_max(p.orders_held_for, p.ts_ms) AS held_for, arg_max({_ORDERS_ROWS}, p.ts_ms) AS orders
                   FROM {progress} p, open_run r, since
                   WHERE p.batch_id >= r.started_batch AND p.ts_ms >= since.from_ms GROUP BY p.batch_id),
        so_far AS (SELECT max(batch_id) AS last_batch, count(*) AS batches, max(held_for) AS held_for,
                          CASE WHEN count(*) = count(orders) THEN sum(orders) END AS orders
                   FROM shared WHERE orders_shared)
        SELECT r.started_batch, epoch_ms(r.ts_ms) AS started_at,
               CASE WHEN r.ended_ms IS NOT NULL THEN epoch_ms(r.ended_ms) END AS ended_at,
               CAST(coalesce(r.last_batch, f.last_batch) AS BIGINT) AS last_batch,
               CAST(coalesce(r.batches, f.batches) AS BIGINT) AS batches,
               CAST(coalesce(r.held_for, f.held_for, r.held_at_start) AS BIGINT) AS held_for,
               CAST(CASE WHEN r.ended_ms IS NOT NULL THEN r.orders ELSE f.orders END AS BIGINT) AS orders,
               r.ended_ms IS NULL AS open
        FROM runs r LEFT JOIN so_far f ON r.ended_ms IS NULL AND r.ts_ms = (SELECT ts_ms FROM open_run)
        ORDER BY r.ts_ms DESC"""
    return query_frame(connection, sql)
