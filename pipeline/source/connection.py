"""How the source reaches a Pulsar broker: clients, readers, partitions and message ids.

Shared by the read tasks (pipeline/source/reader.py) and the driver's questions to the broker
(pipeline/source/probes.py). Only the standard Pulsar protocol is used (readers from message
ids; no seek, no subscriptions), so the same code runs on pulsar-lite and Apache Pulsar.
"""

from __future__ import annotations

from pipeline.config import pulsar_authentication
from pipeline.errors import SourceError
from pipeline.source.offsets import EARLIEST, Position

LAST_INDEX = (1 << 31) - 1  # a batch index after every real one (the C++ client's is an int32)
# A reader's subscription is named ``<READER_PREFIX>-reader-<random>``, so the embedded broker's
# keeper can tell the source's closed readers from anyone else's (pipeline/feed/reader_sweep.py).
READER_PREFIX = "stateful-streams"
_clients: dict[str, object] = {}
# The token each broker URL is reached with in this process (``pulsar.auth_token``): the data
# source sets it from its ``authToken`` option on the driver and in every read task.
_tokens: dict[str, str] = {}


def use_token(service_url: str, token: str | None) -> None:
    """Reach ``service_url`` with ``token`` (None: no authentication) from this process."""
    if token:
        _tokens[service_url] = token
    else:
        _tokens.pop(service_url, None)


def new_client(service_url: str):
    import pulsar

    return pulsar.Client(service_url, operation_timeout_seconds=15, connection_timeout_ms=5000,
                         authentication=pulsar_authentication(_tokens.get(service_url)),
                         logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def pulsar_client(service_url: str):
    """One client per URL per Python process (workers are reused, so connections are too)."""
    client = _clients.get(service_url)
    if client is None:
        client = _clients[service_url] = new_client(service_url)
    return client


def client_message_id(text: str, after_whole_entry: bool = False):
    """A message id text as the C++ client's own id object, as messages carry it: readers start
    from it, and ids of one partition compare with ``<`` (ledger, entry, batch), which the read
    loops use to skip messages sent again."""
    import _pulsar

    if text == EARLIEST:
        return _pulsar.MessageId.earliest
    pos = Position.parse(text)
    # "after the whole entry": a batch index above any real one, so ``<`` skips every message of it
    batch = LAST_INDEX if after_whole_entry and pos.batch < 0 else pos.batch
    return _pulsar.MessageId(pos.partition, pos.ledger, pos.entry, batch)


def id_text(message_id) -> str:
    return f"{message_id.ledger_id()}:{message_id.entry_id()}:{message_id.partition()}:{message_id.batch_index()}"


def partition_topic(topic: str, partition: str) -> str:
    """The Pulsar topic name of a partition key ('-1' is a non-partitioned topic)."""
    return topic if partition == "-1" else f"{topic}-partition-{partition}"


def open_reader(service_url: str, topic: str, start_id: str, receiver_queue: int = 5000, client=None):
    """A non-durable reader positioned right after ``start_id`` (or at the earliest message)."""
    try:
        return (client or pulsar_client(service_url)).create_reader(
            topic, client_message_id(start_id), receiver_queue_size=receiver_queue,
            subscription_role_prefix=READER_PREFIX)
    except Exception as exc:  # the C++ client raises its own types (Timeout, TopicNotFound, …)
        raise SourceError(f"cannot open a reader on {topic!r} at {start_id!r} via {service_url!r}: {exc}") from exc


def open_on_own_connection(service_url: str, name: str, start_id: str, receiver_queue: int = 5000):
    """A client of its own (so its own connection) and a reader on it right after ``start_id``.

    Every reader the source keeps reads on a connection of its own, and reopens a reader that
    stalls by calling this again at the last id it took: pulsar-lite 0.2.0 stops feeding a
    reader whose connection's outbound buffer filled up (the README's pulsar-lite notes), and a
    caught-up reader sharing a connection misses new messages.
    """
    try:
        client = new_client(service_url)
    except Exception as exc:
        raise SourceError(f"cannot connect to {service_url!r} to read {name!r}: {exc}") from exc
    try:
        return client, open_reader(service_url, name, start_id, receiver_queue, client=client)
    except Exception:
        close_quietly(client)
        raise


def release(client, handle) -> None:
    """Close a consumer or reader made by a client that lives on, and make the client forget it.

    pulsar-client 3.13's ``Client`` keeps every consumer and reader it made in a list until that
    one's ``close()`` returns: ``unsubscribe()`` leaves it there, and so does a ``close()`` that
    raises. The driver's client lives as long as the job and makes a probe consumer per
    partition per batch (probes.py), so each stayed, with its C++ consumer: 51 KB a plan of three
    partitions, about 180 MB an hour at a 0.5 s trigger (issue 28).
    """
    close_quietly(handle)
    kept = getattr(client, "_consumers", None)
    if isinstance(kept, list) and handle in kept:
        kept.remove(handle)


def close_quietly(*closeables) -> None:
    """Close readers and clients; closing one of a dead broker must not mask the real error."""
    for closeable in closeables:
        try:
            if closeable is not None:
                closeable.close()
        except Exception:  # noqa: BLE001 - see the docstring
            pass


def list_partitions(service_url: str, topic: str) -> list[str]:
    """Partition keys of a topic: ['-1'] when it is not partitioned."""
    try:
        names = pulsar_client(service_url).get_topic_partitions(topic)
    except Exception as exc:
        raise SourceError(f"cannot look up partitions of {topic!r} via {service_url!r}: {exc}") from exc
    if len(names) == 1 and names[0] == topic:
        return ["-1"]
    return [name.rsplit("-partition-", 1)[1] for name in names]
