"""Driver-side facts about Pulsar topics, asked of the broker without reading messages.

- :func:`list_partitions`: a topic's partitions (``['-1']`` when it is not partitioned);
- :func:`last_entry_id`: the id of a partition's newest entry, from one ``get_last_message_id``
  on a zero-queue consumer that is unsubscribed at once, so no payload reaches the driver and no
  cursor stays behind to hold messages on Apache Pulsar;
- :func:`find_position_before`: the message before a time, by scanning (once per replay request
  with a time; the one place the driver reads messages, because pulsar-lite's seek is broken).

Only the standard Pulsar protocol is used, so the same code runs on pulsar-lite and Apache Pulsar.
"""

from __future__ import annotations

import itertools
import os
import time

from pipeline.errors import SourceError
from pipeline.source.offsets import EARLIEST
from pipeline.source.reader import id_text, open_reader, partition_topic, pulsar_client

_probe_names = itertools.count()


def list_partitions(service_url: str, topic: str) -> list[str]:
    """Partition keys of a topic: ['-1'] when it is not partitioned."""
    try:
        names = pulsar_client(service_url).get_topic_partitions(topic)
    except Exception as exc:
        raise SourceError(f"cannot look up partitions of {topic!r} via {service_url!r}: {exc}") from exc
    if len(names) == 1 and names[0] == topic:
        return ["-1"]
    return [name.rsplit("-partition-", 1)[1] for name in names]


def last_entry_id(service_url: str, topic: str, partition: str) -> str | None:
    """``ledger:entry:partition:-1`` of the newest entry of a partition (None when it is empty).

    The batch index is dropped on purpose: an end id with -1 covers the whole entry, whatever
    number of messages a producer batched into it (pulsar-lite answers -1 for a batched entry,
    Apache Pulsar its last index; both mean the same entry).
    """
    name = partition_topic(topic, partition)
    client = pulsar_client(service_url)
    try:
        consumer = client.subscribe(name, f"ss-probe-{os.getpid()}-{next(_probe_names)}", receiver_queue_size=0)
    except Exception as exc:
        raise SourceError(f"cannot probe the newest entry of {topic!r} partition {partition} via "
                          f"{service_url!r}: {exc}") from exc
    try:
        mid = consumer.get_last_message_id()
    except Exception:  # pulsar-lite raises on an empty topic
        return None
    finally:
        try:
            consumer.unsubscribe()
        except Exception:  # the broker may refuse; closing is enough then
            consumer.close()
    if mid.entry_id() < 0 or mid.ledger_id() < 0:
        return None
    return f"{mid.ledger_id()}:{mid.entry_id()}:{int(partition)}:-1"


def find_position_before(service_url: str, topic: str, partition: str, time_ms: int, timeout_s: float = 120.0) -> str:
    """The id of the last message published before ``time_ms`` (EARLIEST if none), by scanning.

    pulsar-lite's seek is broken, so this reads from the start; it runs once per replay request.
    """
    import pulsar

    reader = open_reader(service_url, partition_topic(topic, partition), EARLIEST)
    previous = EARLIEST
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                message = reader.read_next(200)
            except pulsar.Timeout:
                return previous
            if message.publish_timestamp() >= time_ms:
                return previous
            previous = id_text(message.message_id())
        raise SourceError(f"scanning {topic!r} for time {time_ms} took over {timeout_s:.0f}s")
    finally:
        reader.close()
