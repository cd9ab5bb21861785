"""The SQL pipelines' JVM topic sender (``sql.topic_sender = jvm``): each batch's messages handed
to the JVM at once and sent by the Java Pulsar client, where Python's client pays a call per message.

Lifecycle, on the driver: :func:`open_sinks` when the pipeline starts (one
``statefulstreams.TopicSink`` per target topic: a Java client and producer), :func:`send_from_jvm`
once per micro-batch in foreachBatch, before the batch's tables commit, :func:`close_sinks` when
it stops. The guarantee is Python's sender's (pipeline/sql/sink.py send_messages): the messages
in order, keyed, every one acknowledged before the batch goes on, a failed send failing the batch
(at least once). The payloads are the same bytes (pipeline/sql/sink.py build_payloads).

The client's jars (the shaded ``org.apache.pulsar:pulsar-client`` and its API jars, the version
of the apache test tier's broker) are copied from Maven Central once by ``mvn``
(pipeline/runtime/maven.py; ``make setup`` runs ``python -m pipeline.sql.jvm_sender fetch``
before compiling TopicSink against them); pipeline/runtime/spark.py puts them on the driver's
classpath with the operators' jar.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.errors import ConfigError, SinkError
from pipeline.feed.apache_broker import PULSAR_VERSION
from pipeline.runtime.maven import cache_root, copy_jars, stamp

POM = Path(__file__).resolve().parents[1] / "jvm" / "pulsar_client" / "pom.xml"
CLIENT_ARTIFACTS = ("pulsar-client", "pulsar-client-api", "pulsar-client-admin-api")


def lib_dir() -> Path:
    return cache_root() / f"pulsar-client-{PULSAR_VERSION}" / "lib"


def fetch_client_jars(quiet: bool = True) -> list[Path]:
    """The Java Pulsar client's jars, copied by ``mvn`` on the first call (about 24 MB), then cached."""
    copy_jars(POM, lib_dir(), f"pulsar-client-{PULSAR_VERSION}.jar", f"the Java Pulsar client {PULSAR_VERSION}",
              (f"-Dpulsar.version={PULSAR_VERSION}", f"-DincludeArtifactIds={','.join(CLIENT_ARTIFACTS)}"), quiet)
    return client_jars()


def client_jars() -> list[Path]:
    """The client's jars when fetched, else none (the Python sender needs none)."""
    lib = lib_dir()
    return sorted(lib.glob("*.jar")) if stamp(lib).exists() else []


def open_sinks(spark, service_url: str, auth_token: str | None, topics: list[str]) -> list:
    """One TopicSink (a py4j handle) per topic, on the broker at ``service_url`` (``auth_token``:
    ``pulsar.auth_token``); close them with close_sinks."""
    if not client_jars():
        raise ConfigError("sql.topic_sender 'jvm' needs the Java Pulsar client's jars, which are not fetched "
                          f"(no {str(lib_dir())!r}); run `make setup`, or set sql.topic_sender to 'python'")
    from py4j.protocol import Py4JJavaError

    sinks = []
    try:
        for topic in topics:
            sinks.append(spark._jvm.statefulstreams.TopicSink.open(service_url, auth_token or "", topic))
    except Py4JJavaError as exc:
        close_sinks(sinks)
        raise SinkError(f"cannot create a JVM producer for topic {topic!r}: {exc.java_exception}") from exc
    return sinks


def encode_batch(keys, payloads) -> bytes:
    """One batch's messages as TopicSink.send reads them: the two columns' Arrow buffers, framed.

    # in:  keys ["101", "100"], payloads [b'{"n":3}', b'']
    # out: int32 n=2 | key offsets 0,3,6 | payload offsets 0,7,7 | b"101100" | b'{"n":3}'  (little-endian)
    """
    import numpy as np
    import pyarrow as pa

    n = len(keys)
    columns = []
    for values in (keys, payloads.cast(pa.binary())):
        values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        if values.null_count:
            raise SinkError(f"a message batch has {values.null_count} NULL keys or payloads; a NULL key is not "
                            "sendable (split_unsendable refuses it) and a delete's payload is empty, not NULL")
        _, offsets, data = values.buffers()
        offsets = np.frombuffer(offsets, "<i4")[values.offset:values.offset + n + 1] if n else np.zeros(1, "<i4")
        start, end = int(offsets[0]), int(offsets[-1])
        columns.append((offsets - start, data.slice(start, end - start).to_pybytes() if end > start else b""))
    (key_offsets, key_data), (payload_offsets, payload_data) = columns
    return b"".join([np.array([n], "<i4").tobytes(), key_offsets.astype("<i4").tobytes(),
                     payload_offsets.astype("<i4").tobytes(), key_data, payload_data])


def send_from_jvm(sink, keys, payloads) -> int:
    """Send one batch's messages (a key and a payload per row, b"" for a delete) through ``sink``,
    in one call. Raises SinkError if a send failed."""
    from py4j.protocol import Py4JJavaError

    if not len(keys):
        return 0
    try:
        return sink.send(encode_batch(keys, payloads))
    except Py4JJavaError as exc:
        raise SinkError(f"the JVM topic sender failed: {exc.java_exception}") from exc


def send_result_from_jvm(sink, plan, result) -> None:
    """The result rows (pipeline/sql/sink.py build_result) to ``sink``'s topic."""
    from pipeline.sql.sink import build_payloads

    send_from_jvm(sink, result["_key"], build_payloads(plan, result))


def close_sinks(sinks: list) -> None:
    for sink in sinks:
        sink.close()


if __name__ == "__main__":
    if sys.argv[1:] == ["fetch"]:
        print(":".join(str(jar) for jar in fetch_client_jars()))
    else:
        sys.exit("usage: python -m pipeline.sql.jvm_sender fetch  (prints the jars' classpath)")
