"""A SQL pipeline fed as users feed it: pulsar-client's default producer and a batching one, and
messages whose metadata sits at its limits (end-to-end tier, one pipeline run for every check).

One statement set runs the same projection (WHERE, expressions, the ``eventTime``, ``properties``
and ``key`` METADATA columns) over two tables: ``plain``, fed by the default producer (no
batching), and ``batched``, fed the same messages by a batching producer. Both must end with the
same exact changelog. Among the messages are hostile ones: an empty key, a 64 KB key, key bytes
that are not UTF-8, a key with NUL and newlines, huge and odd properties, event times at 0, 1 and
2**63-1. Each of those has a key of its own, so each must end in exactly one row of the result
or of ``dead_letter``, and the pipeline must keep running. (A publish time is the broker's to
set: no producer can send one at 0 or 2**63-1; the source's handling of those is
tests/test_hostile_times.py's.)
"""

from __future__ import annotations

import json

import pytest

from pipeline import store
from pipeline.metrics import read_events
from pipeline.sql.script import build_pipeline
from factories import send_raw
from sqlhelp import Running, fresh_topics, read_topic, sink_rows
from waiting import wait_for

pytestmark = pytest.mark.e2e

TABLE = """CREATE TABLE {name} ({columns}, PRIMARY KEY (uid) NOT ENFORCED) WITH ('connector' = 'upsert-pulsar',
 'topic' = 'persistent://public/default/{name}', 'key.format' = 'raw', 'value.format' = 'json');"""
SOURCE = ("uid STRING, id INT, name STRING, eventTime TIMESTAMP(3) METADATA, properties MAP<STRING, STRING> METADATA, "
          "k STRING METADATA FROM 'key' VIRTUAL")
TARGET = "uid STRING, name STRING, tenfold INT, at STRING, tier STRING, k STRING"
SELECT = ("SELECT uid, UPPER(name), id * 10, CAST(eventTime AS STRING), COALESCE(properties['tier'], 'none'), k "
          "FROM {source} WHERE id > 0")
FEEDS = ("plain", "batched")
SCRIPT = "\n".join([*(TABLE.format(name=f, columns=SOURCE) for f in FEEDS),
                    *(TABLE.format(name=f"out_{f}", columns=TARGET) for f in FEEDS),
                    "EXECUTE STATEMENT SET BEGIN",
                    *(f"INSERT INTO out_{f} {SELECT.format(source=f)};" for f in FEEDS), "END;"])
T0 = 1_700_000_000_123  # 2023-11-14 22:13:20.123 UTC
MAX_EVENT_TIME = 2**63 - 1


def sent(key: bytes | None, record: dict | None, props: dict | None = None, event_time: int | None = None) -> tuple:
    """A message as factories.send_raw takes it: an empty payload for None (a tombstone)."""
    return key, b"" if record is None else json.dumps(record).encode(), props, event_time


def user(uid: str, id_: int, name: str = "x") -> dict:
    return {"uid": uid, "id": id_, "name": name}


def out(key: str, uid: str, name: str, tenfold: int, at: str | None = None, tier: str = "none") -> tuple[str, str]:
    """A changelog entry as the topic holds it: (key, the target's columns as the sink's JSON)."""
    return key, json.dumps({"uid": uid, "name": name, "tenfold": tenfold, "at": at, "tier": tier, "k": key},
                           separators=(",", ":"))


# Published before the pipeline starts (one micro-batch): a key's last change wins, a row that
# never matched WHERE, or came and went within the batch, sends nothing.
FIRST = [sent(b"u1", user("u1", 1, "a"), {b"tier": b"gold"}, T0),
         sent(b"u1", user("u1", 2, "b"), {b"tier": b"silver"}, T0 + 1),
         sent(b"u2", user("u2", 3)), sent(b"u2", None), sent(b"u3", user("u3", 0)), sent(b"u3", user("u3", 5, "c")),
         sent(b"u4", user("u4", 4)), sent(b"u4", user("u4", -1))]
FIRST_CHANGES = [out("u1", "u1", "B", 20, "2023-11-14 22:13:20.124", "silver"), out("u3", "u3", "C", 50)]
# Published while it runs, one message per key: (message, what it ends in: a changelog entry, or
# the dead letter's error, or None for nothing)
BIG_KEY = b"k" * 65_536
LATER = [
    (sent(b"u1", user("u1", 0)), ("u1", "")),
    (sent(b"u2", user("u2", 7, "d")), out("u2", "u2", "D", 70)),
    (sent(b"u3", None), ("u3", "")),
]
HOSTILE = [  # each its own key: each in exactly one row of the result or of dead_letter
    (sent(b"", user("h0", 1)), "message has no key"),
    (sent(BIG_KEY, user("h1", 1)), out(BIG_KEY.decode(), "h1", "X", 10)),
    (sent(b"k\xff\xfe", user("h2", 1)), out("k\\xff\\xfe", "h2", "X", 10)),  # escaped, as the source reads it
    (sent(b"a\x00b\nc\r\n", user("h3", 1)), out("a\x00b\nc\r\n", "h3", "X", 10)),
    (sent(b"h4", user("h4", 1), {b"tier": b"t" * 100_000, **{f"p{i}".encode(): b"v" for i in range(500)}}),
     out("h4", "h4", "X", 10, tier="t" * 100_000)),
    (sent(b"h5", user("h5", 1), {b"": b"", "\u202e".encode(): b"\x00", b"tier": "\U0001F600\n".encode()}),
     out("h5", "h5", "X", 10, tier="\U0001F600\n")),
    (sent(b"h6", user("h6", 1), {b"tier": b"\xc3\x28"}), out("h6", "h6", "X", 10)),  # not UTF-8: read as none
    (sent(b"h7", user("h7", 1), None, 0), out("h7", "h7", "X", 10)),  # 0: the producer set none
    (sent(b"h8", user("h8", 1), None, 1), out("h8", "h8", "X", 10, at="1970-01-01 00:00:00.001")),
    (sent(b"h9", user("h9", 1), None, MAX_EVENT_TIME),
     f"table 'batched': message event_time {MAX_EVENT_TIME} is outside the times the job can hold"),
]
LATER += HOSTILE


def key_as_read(key: bytes) -> str | None:
    """The key the pipeline sees (pipeline/source/reader.py): not UTF-8 escaped, empty as none."""
    return key.decode("utf-8", "backslashreplace") or None


def test_default_and_batching_producers_give_one_changelog_and_hostile_metadata_lands_once(settings_factory, broker,
                                                                                           spark):
    settings = settings_factory(job__restart__delay="3s")  # rides out a loaded machine
    topics = fresh_topics(*FEEDS, *(f"out_{f}" for f in FEEDS))
    url, name = broker.service_url, "producers"
    for feed in FEEDS:
        send_raw(url, topics[feed], FIRST, batching=feed == "batched")
    later_changes = sorted(end for _, end in LATER if isinstance(end, tuple))

    with Running(settings, build_pipeline(SCRIPT, topics), name, spark) as running:
        def changelog(feed: str, count: int):
            running.check()
            on_topic = read_topic(url, topics[f"out_{feed}"], timeout_ms=1000)
            return len(on_topic) >= count and on_topic

        for feed in FEEDS:
            assert sorted(wait_for(lambda: changelog(feed, 2), 300, what=f"{feed}'s first batch")) == FIRST_CHANGES
        ids = {feed: send_raw(url, topics[feed], [message for message, _ in LATER], batching=feed == "batched")
               for feed in FEEDS}
        logs = {feed: wait_for(lambda: changelog(feed, 2 + len(later_changes)), 120, what=f"{feed}'s changelog")
                for feed in FEEDS}
        dead = wait_for(lambda: (rows := sink_rows(settings, name, "dead_letter")) and len(rows) >= 4 and rows, 60,
                        what="the dead letters")
        results = {feed: sink_rows(settings, name, f"result_out_{feed}") for feed in FEEDS}
        root = store.sql_dir(settings.data_dir, name)
        assert running.thread.is_alive() and not running.error
        assert not read_events(root, ("restart", "sql_failed")), "the pipeline restarted or failed"

    for feed in FEEDS:
        # the exact changelog: the first batch's, then one entry per key (their order is the batch's)
        assert sorted(logs[feed][:2]) == FIRST_CHANGES and sorted(logs[feed][2:]) == later_changes, feed
    assert sorted(logs["plain"][:2]) == sorted(logs["batched"][:2]) and sorted(logs["plain"]) == sorted(logs["batched"])

    for feed in FEEDS:
        topic = topics[feed]
        for (message, end), message_id in zip(HOSTILE, ids[feed][-len(HOSTILE):]):
            key = key_as_read(message[0])
            in_result = [r for r in results[feed] if key is not None and r["_key"] == key]
            in_dead = [r for r in dead if r["source_topic"] == topic and r["source_message_id"] == message_id]
            assert len(in_result) + len(in_dead) == 1, (feed, key and key[:20], in_result[:1], in_dead)
            if isinstance(end, str):
                error = in_dead[0]["error"]
                assert end.replace("'batched'", repr(feed)) in error and "\n" not in error, error
                assert in_dead[0]["key"] == key
            else:
                assert [(r["_key"], r["_op"]) for r in in_result] == [(key, "delete" if end[1] == "" else "upsert")]
