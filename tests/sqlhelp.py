"""Helpers of the SQL pipeline tests: the seed's scripts on fresh topics, and reading the target topic."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import duckdb
import pulsar

from app.sql_queries import current_result
from pipeline import store
from pipeline.sinks import table_files
from pipeline.source.connection import close_quietly, id_text, open_on_own_connection
from pipeline.source.offsets import EARLIEST
from pipeline.sql.runner import run_sql_pipeline

SQL_DIR = Path(__file__).resolve().parent.parent / "data" / "sql"
COUNT_SQL = SQL_DIR / "user_count_by_account.sql"
JOIN_SQL = SQL_DIR / "user_favorite_color_and_cheese.sql"


def fresh_topics(*tables: str) -> dict[str, str]:
    """Table name -> a topic no other test uses."""
    tag = uuid.uuid4().hex[:8]
    return {table: f"persistent://public/default/{table}-{tag}" for table in tables}


def message(key: str, record: dict | None) -> tuple[str, bytes]:
    """(key, JSON payload), or an empty payload (a tombstone) for None."""
    return key, b"" if record is None else json.dumps(record, separators=(",", ":")).encode()


def sink_rows(settings, name: str, sink: str) -> list[dict]:
    """Every committed row of one of a pipeline's Delta tables (``result``, a statement set's
    ``result_<target>``, ``dead_letter``): the change rows, not the current result."""
    files = table_files(store.sql_dir(settings.data_dir, name) / "sinks" / sink)
    if not files:
        return []
    with duckdb.connect() as con:
        rel = con.sql(f"SELECT * FROM read_parquet({files!r}, union_by_name = true, hive_partitioning = false)")
        return [dict(zip(rel.columns, values)) for values in rel.fetchall()]


class TopicTail:
    """A topic read as it grows, for a test that waits on it: each poll reads only what came
    after the last message it gave, each message once (pulsar-lite's reader may deliver an entry
    again). Each poll's reader is a new one on a connection of its own: pulsar-lite 0.2.0 stops
    feeding a reader kept open while it is caught up (pipeline/source/reader.py)."""

    def __init__(self, service_url: str, topic: str):
        self.service_url, self.topic = service_url, topic
        self.found: list[tuple[str, str]] = []
        self.seen: set[str] = set()
        self.after = EARLIEST

    def read(self, timeout_ms: int = 300) -> list[tuple[str, str]]:
        """Every (key, payload text) so far, oldest first: read until none arrives for ``timeout_ms``."""
        client, reader = open_on_own_connection(self.service_url, self.topic, self.after)
        try:
            while True:
                try:
                    msg = reader.read_next(timeout_millis=timeout_ms)
                except pulsar.Timeout:
                    return list(self.found)
                if id_text(msg.message_id()) not in self.seen:
                    self.seen.add(id_text(msg.message_id()))
                    self.after = id_text(msg.message_id())
                    self.found.append((msg.partition_key(), msg.data().decode()))
        finally:
            close_quietly(reader, client)


def read_topic(service_url: str, topic: str, timeout_ms: int = 1500) -> list[tuple[str, str]]:
    """Every (key, payload text) on a topic, oldest first, each message once; stops when none
    arrives for ``timeout_ms``."""
    return TopicTail(service_url, topic).read(timeout_ms)


def expect_changelog(running: "Running", name: str, url: str, topic: str, steps, send) -> list[tuple[str, str]]:
    """Each of ``steps``, (messages or None when already sent, the changes they make): its messages
    sent with ``send``, then the upsert ``topic`` waited on until it has the step's changes, which
    must be exactly those (in any order within the step). Returns the whole changelog expected."""
    from waiting import wait_for

    expected: list[tuple[str, str]] = []
    tail = TopicTail(url, topic)
    for step, (messages, changes) in enumerate(steps):
        if messages is not None:
            send(messages)
        done = len(expected)
        expected += sorted(changes)

        def arrived():
            running.check()
            on_topic = tail.read()
            return len(on_topic) >= len(expected) and on_topic

        on_topic = wait_for(arrived, 240 if step == 0 else 120, what=f"{name} step {step}")
        assert len(on_topic) == len(expected) and sorted(on_topic[done:]) == expected[done:], f"step {step}"
    return expected


def latest_per_key(messages: list[tuple[str, str]]) -> dict[str, dict]:
    """The upsert topic's table: the last payload per key, tombstoned keys left out."""
    table: dict[str, str] = {}
    for key, payload in messages:
        table[key] = payload
    return {key: json.loads(payload) for key, payload in table.items() if payload}


class Running:
    """A pipeline on the shared SparkSession in a thread; stopped (and its error re-raised) on exit."""

    def __init__(self, settings, plan, name, spark):
        self.stop, self.error = threading.Event(), []
        self.thread = threading.Thread(target=self._run, args=(settings, plan, name, spark), daemon=True)

    def _run(self, settings, plan, name, spark):
        try:
            run_sql_pipeline(settings, plan, name, stop=self.stop, spark=spark)
        except BaseException as exc:  # handed to the test thread
            self.error.append(exc)

    def __enter__(self):
        self.thread.start()
        return self

    def check(self) -> None:
        """The pipeline's own error, at once, if it stopped: a wait must not outlast it."""
        if self.error:
            raise self.error[0]

    def result(self, settings, name: str, sink: str = "result") -> list[dict]:
        """The current result; the pipeline's own error, at once, if it stopped."""
        self.check()
        return result(settings, name, sink)

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the SQL pipeline did not stop"
        if self.error and not exc[0]:
            raise self.error[0]


def result(settings, name: str, sink: str = "result") -> list[dict]:
    """The current result as records, SQL NULL as None (pandas reads a null double as NaN); a
    statement set's INSERT has its own sink, ``result_<target>``."""
    with duckdb.connect() as con:
        frame = current_result(con, settings.data_dir, name, sink=sink)
    return frame.astype(object).where(frame.notna(), None).to_dict("records")
