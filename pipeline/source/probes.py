"""What the driver asks of the broker about a topic partition, reading no message to plan a batch.

- :func:`newest_entry`: a partition's newest entry (and its size when the id says it), all
  planning needs (pipeline/source/datasource.py asks it per partition per batch);
  :func:`last_entry_id` the entry alone, for a replay's target and a ``latest`` start;
- :func:`find_position_before`: the message before a time, by scanning, once per replay request
  with a time (the one place the driver reads messages: pulsar-lite's seek is broken).

Only the standard Pulsar protocol is used, so the same code runs on pulsar-lite and Apache Pulsar.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

from pipeline.errors import SourceError
from pipeline.source.offsets import EARLIEST
from pipeline.source.connection import id_text, open_reader, partition_topic, pulsar_client, release

# The probe consumer's subscription: one name per process, so each partition's is made and removed
# again under the same name. pulsar-lite 0.2.0 keeps every subscription name it has seen in its
# metadata file: a new name per probe grew it by 50 bytes a probe, and each plan got slower with
# them (8 ms to 30 ms after 3,000 plans of three partitions; 4 ms flat with one name).
_probe_name: tuple[int, str] | None = None  # (pid, name): a forked child makes its own
_probing = threading.Lock()


def probe_subscription() -> str:
    """This process's probe subscription name, ``ss-probe-<random>``."""
    global _probe_name
    if _probe_name is None or _probe_name[0] != os.getpid():
        _probe_name = (os.getpid(), f"ss-probe-{uuid.uuid4().hex[:16]}")
    return _probe_name[1]


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
        release(pulsar_client(service_url), reader)


def last_entry_id(service_url: str, topic: str, partition: str) -> str | None:
    """``ledger:entry:partition:-1``, the newest entry of a partition (None when it is empty)."""
    return newest_entry(service_url, topic, partition)[0]


def newest_entry(service_url: str, topic: str, partition: str) -> tuple[str | None, int | None]:
    """The newest entry of a partition as ``ledger:entry:partition:-1`` (None when it is empty),
    and how many messages it holds when the broker's id says so (None when it does not).

    One ``get_last_message_id`` on a consumer with no receiver queue, so no message reaches
    the driver; the consumer is unsubscribed and closed at once (the Python client has no non-durable
    subscriptions), leaving no cursor behind that would hold messages on Apache Pulsar. The
    batch index is dropped from the id on purpose: an end with -1 covers the whole entry,
    whatever number of messages a producer batched into it. Apache Pulsar's id names the entry's
    last message, so its batch index + 1 is the entry's size; pulsar-lite gives -1 for any entry.
    """
    client = pulsar_client(service_url)
    name = partition_topic(topic, partition)
    with _probing:  # the subscription is exclusive: two threads of a process must not share it at once
        try:
            consumer = client.subscribe(name, probe_subscription(), receiver_queue_size=0)
        except Exception as exc:
            raise SourceError(f"cannot ask {service_url!r} for the newest entry of {topic!r}: {exc}") from exc
        try:
            mid = consumer.get_last_message_id()
        except Exception:  # pulsar-lite raises on an empty topic
            return None, None
        finally:
            try:
                consumer.unsubscribe()
            except Exception:  # noqa: BLE001 - the broker may refuse; closing is enough then
                pass
            release(client, consumer)  # closed either way, or the client keeps it (and its memory) for good
    if mid.entry_id() < 0 or mid.ledger_id() < 0:
        return None, None
    size = mid.batch_index() + 1 if mid.batch_index() >= 0 else None
    return f"{mid.ledger_id()}:{mid.entry_id()}:{int(partition)}:-1", size
