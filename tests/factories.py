"""Record factories with defaults, and a tiny publisher, for tests that go through the broker."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pulsar

from pipeline import wire


def user(uid: int, **fields) -> dict:
    return {"id": uid, "firstName": f"First{uid}", "lastName": f"Last{uid}", "emailAddress": f"u{uid}@example.com",
            "createdAt": 1_600_000_000_000 + uid, "deletedAt": -1, "mergedAt": -1, "parentUserId": -1, **fields}


def item(iid: int, **fields) -> dict:
    return {"id": iid, "createdAt": 1_500_000_000_000 + iid, "adjective": "shiny", "category": "gadget",
            "modifier": "pro", "name": f"item{iid}", "price": 10.0 + iid, **fields}


def order(invoice: int, user_id: int, item_id: int, **fields) -> dict:
    return {"invoiceId": invoice, "lineItemId": invoice * 10, "userId": user_id, "itemId": item_id,
            "itemName": f"item{item_id}", "itemCategory": "gadget", "price": 3.5, "createdAt": 1_700_000_000_000 + invoice,
            "paidAt": -1, **fields}


def publish(service_url: str, topic: str, messages: list[tuple[str | None, bytes]], properties: dict | None = None,
            batching: bool = True) -> int:
    """Send (key, payload) pairs in order and wait for every ack; returns the count.

    ``batching=False`` sends as pulsar-client does by default (its Python producer does not
    batch): every message is an entry of its own.

    Raises if the broker refused any of them, so a test never waits for a message that was
    never stored (a producer batch over the broker's size limit is refused whole).
    """
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    refused: list[str] = []

    def on_sent(result, _message_id) -> None:
        if result != pulsar.Result.Ok:
            refused.append(str(result))

    try:
        if batching:
            producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=2,
                                              block_if_queue_full=True)  # wait for room; never drop a send
        else:  # pulsar-client's defaults but for the full queue
            producer = client.create_producer(topic, block_if_queue_full=True)
        for key, payload in messages:
            if key is None:
                producer.send_async(payload, on_sent, properties=properties)
            else:
                producer.send_async(payload, on_sent, partition_key=key, properties=properties)
        producer.flush()
    finally:
        client.close()
    if refused:
        raise AssertionError(f"the broker refused {len(refused)} of {len(messages)} messages to {topic}: {refused[0]}")
    return len(messages)


def publish_timed(service_url: str, topic: str, messages: list[tuple[str, bytes, int]], batching: bool = False) -> None:
    """Send (key, payload, event time ms) triples in order, each with its event time: unbatched,
    or with ``batching`` several to an entry (each message keeps its own event time)."""
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        if not batching:
            producer = client.create_producer(topic, batching_enabled=False)
            for key, payload, at in messages:
                producer.send(payload, partition_key=key, event_timestamp=at)
            return
        producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=2,
                                          block_if_queue_full=True)
        refused: list[str] = []
        for key, payload, at in messages:
            producer.send_async(payload, lambda result, _id: result == pulsar.Result.Ok or refused.append(str(result)),
                                partition_key=key, event_timestamp=at)
        producer.flush()
        assert not refused, f"the broker refused {len(refused)} of {len(messages)} messages to {topic}: {refused[0]}"
    finally:
        client.close()


def keyed(kind: str, records: list[dict]) -> list[tuple[str, bytes]]:
    return [(wire.message_key(kind, r), wire.encode(r)) for r in records]


def send_raw(service_url: str, topic: str, messages: list[tuple], batching: bool = False) -> list[str]:
    """Send (key, payload, properties, event time) messages, keys and properties as raw bytes (the
    protocol carries any; pulsar.Producer only takes text, its message builder takes bytes), with
    pulsar-client's default producer (no batching) or a batching one; each message's id text."""
    import _pulsar  # the message builder under pulsar.Producer: it takes keys and properties as bytes

    from pipeline.source.connection import id_text

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    ids: list[str | None] = [None] * len(messages)
    refused: list[str] = []

    def on_sent(index: int):
        def done(outcome, message_id) -> None:
            if outcome == _pulsar.Result.Ok:
                ids[index] = id_text(message_id)
            else:
                refused.append(str(outcome))
        return done

    try:
        producer = (client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50,
                                           block_if_queue_full=True) if batching
                    else client.create_producer(topic, block_if_queue_full=True))
        for index, (key, payload, props, event_time) in enumerate(messages):
            builder = _pulsar.MessageBuilder().content(payload)
            if key:
                builder.partition_key(key)
            for name, value in (props or {}).items():
                builder.property(name, value)
            if event_time is not None:
                builder.event_timestamp(event_time)
            producer._producer.send_async(builder.build(), on_sent(index))
        producer.flush()
    finally:
        client.close()
    assert not refused and None not in ids, f"the broker refused messages to {topic}: {refused[:1]}"
    return ids


@contextmanager
def broker_with_partitions(data_dir: Path, partitions: dict[str, int]):
    """A pulsar-lite broker of its own in ``data_dir`` on which each topic ``partitions`` names has
    that many partitions. pulsar-lite has no admin API: it keeps partitioned topics in its metadata
    file, read at start-up (its ``default_partitions`` setting would also partition the topics
    named after partitions)."""
    from pipeline.feed.broker import EmbeddedBroker

    (Path(data_dir) / "broker").mkdir(parents=True, exist_ok=True)
    (Path(data_dir) / "broker" / "db.metadata.json").write_text(json.dumps(
        {"version": 2, "partitioned_topics": {topic: {"partitions": n} for topic, n in partitions.items() if n > 1}}))
    with EmbeddedBroker(Path(data_dir)) as running:
        yield running


def send_routed(service_url: str, topic: str, messages: list[tuple[str, bytes, int]]) -> dict[str, int]:
    """(key, payload, event time) messages, unbatched, routed by key (pulsar-lite makes a
    partition's own name another topic); returns the partition each key went to."""
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        return {key: producer.send(payload, partition_key=key, event_timestamp=at).partition()
                for key, payload, at in messages}
    finally:
        client.close()
