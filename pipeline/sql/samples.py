"""Publishing a SQL pipeline's sample messages (``data/sql/NAME.messages.jsonl``) to its tables' topics.

Each line is ``{"table": "users", "key": "100-1", "value": {…}}``; a ``null`` value is a tombstone
(an empty payload). Used by ``make demo`` (pipeline/demo.py) and by hand; the messages go in file
order, each to the topic the plan maps its table to.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.sql.plan import Plan


def load_samples(path: Path, plan: Plan | tuple[Plan, ...]) -> list[tuple[str, str, bytes]]:
    """(topic, key, payload) per line, checked against the tables the plan (or a statement set's plans) read."""
    topics = {table.name: table.topic for p in (plan if isinstance(plan, tuple) else (plan,)) for table in p.sides}
    messages = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
            table, key, value = sample["table"], sample["key"], sample["value"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{str(path)!r} line {number}: not {{\"table\", \"key\", \"value\"}} JSON ({exc})") from None
        if table not in topics:
            raise ConfigError(f"{str(path)!r} line {number}: table {table!r} is not read by this pipeline; "
                              f"its tables are {sorted(topics)}")
        payload = b"" if value is None else json.dumps(value, separators=(",", ":")).encode()
        messages.append((topics[table], key, payload))
    return messages


def publish_samples(client, messages: list[tuple[str, str, bytes]]) -> int:
    """Send the messages in order (one producer per topic) and wait for each; returns the count."""
    producers = {}
    try:
        for topic, key, payload in messages:
            if topic not in producers:
                producers[topic] = client.create_producer(topic)
            producers[topic].send(payload, partition_key=key)
    finally:
        for producer in producers.values():
            producer.close()
    return len(messages)
