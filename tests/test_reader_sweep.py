"""Which subscriptions the embedded broker's keeper removes, and when (pure: no broker; the
sweep against a real pulsar-lite is tests/test_broker.py's)."""

from __future__ import annotations

from pipeline.feed.reader_sweep import ReaderSweep, source_subscriptions
from pipeline.source.connection import READER_PREFIX

OURS = f"{READER_PREFIX}-reader-0a1b2c3d4e"


def metadata(**topics: list[str]) -> dict:
    """pulsar-lite's db.metadata.json with these topics' subscriptions, under public/default."""
    return {"version": 2, "/data/broker/db": {"public": {"default": {"persistent": {
        topic: {"subscriptions": dict.fromkeys(names, {})} for topic, names in topics.items()}}}},
        "partitioned_topics": {}}


def test_only_the_sources_reader_subscriptions_are_found_on_every_topic():
    found = source_subscriptions(metadata(**{"users-partition-0": [OURS, "audit", "reader-99aa00bb11"],
                                             "orders": [f"{READER_PREFIX}-reader-ffffffffff"], "items": []}))
    assert found == {("persistent://public/default/users-partition-0", OURS),
                     ("persistent://public/default/orders", f"{READER_PREFIX}-reader-ffffffffff")}


def test_metadata_of_another_shape_finds_nothing_rather_than_failing():
    assert source_subscriptions({"version": 2, "x": [], "/db": {"public": {"default": {"persistent": {"t": []}}}},
                                 "partitioned_topics": {"a": 1}}) == set()


def test_a_subscription_is_due_once_seen_for_the_stale_time_and_never_again_once_removed(tmp_path):
    sweep = ReaderSweep(tmp_path, stale_s=120.0)
    a, b = ("t", "a"), ("t", "b")
    assert sweep.due({a}, now=1000.0) == []
    assert sweep.due({a, b}, now=1100.0) == []
    assert sweep.due({a, b}, now=1120.0) == [a]  # b first seen at 1100
    sweep.removed.add(a)
    assert sweep.due({a, b}, now=1300.0) == [b]
    assert sweep.due({a}, now=1400.0) == []  # b gone from the metadata: forgotten
    assert sweep.first_seen == {}


def test_a_missing_or_half_written_metadata_file_sweeps_nothing(tmp_path):
    sweep = ReaderSweep(tmp_path, stale_s=0.0)
    assert sweep.sweep("pulsar://127.0.0.1:1") == 0
    (tmp_path / "db.metadata.json").write_text('{"version": 2, "/db": {"pub')
    assert sweep.sweep("pulsar://127.0.0.1:1") == 0
