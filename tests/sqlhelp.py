"""Helpers of the SQL pipeline tests: the seed's scripts on fresh topics, and reading the target topic."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pulsar

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


def read_topic(service_url: str, topic: str, timeout_ms: int = 1500) -> list[tuple[str, str]]:
    """Every (key, payload text) on a topic, oldest first; stops when none arrives for ``timeout_ms``."""
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        found = []
        while True:
            try:
                msg = reader.read_next(timeout_millis=timeout_ms)
            except pulsar.Timeout:
                return found
            found.append((msg.partition_key(), msg.data().decode()))
    finally:
        client.close()


def latest_per_key(messages: list[tuple[str, str]]) -> dict[str, dict]:
    """The upsert topic's table: the last payload per key, tombstoned keys left out."""
    table: dict[str, str] = {}
    for key, payload in messages:
        table[key] = payload
    return {key: json.loads(payload) for key, payload in table.items() if payload}
