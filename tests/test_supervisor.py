"""What a restart cannot fix, decided by type (pipeline/runtime/supervisor.py), without Spark."""

from __future__ import annotations

import errno
import os

from pipeline.errors import SinkError
from pipeline.runtime.supervisor import cannot_retry, java_causes, summarize_error


class FakeJava:
    """A py4j Java exception as PySpark's errors carry it (``_origin``)."""

    def __init__(self, name: str, message: str | None, cause: "FakeJava | None" = None):
        self.name, self.message, self.cause = name, message, cause

    def getClass(self):
        return self

    def getName(self):
        return self.name

    def getMessage(self):
        return self.message

    def getCause(self):
        return self.cause


class QueryError(Exception):
    def __init__(self, origin):
        super().__init__("query failed")
        self._origin = origin


def test_a_sink_error_or_a_full_disk_raised_by_the_batch_is_not_retried():
    sink = SinkError("cannot write sink 'enriched' batch 3 under '/x': No space left on device")
    assert cannot_retry(sink, None) is sink
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert cannot_retry(full, None) is full
    assert cannot_retry(OSError(errno.ECONNRESET, "reset"), None) is None  # a broker hiccup: retried
    assert cannot_retry(ValueError("a bug"), None) is None


def test_spark_s_own_write_errors_are_found_along_the_java_causes():
    disk = QueryError(FakeJava("org.apache.spark.SparkException", "Job aborted",
                               FakeJava("java.io.IOException", "No space left on device")))
    assert [name for name, _ in java_causes(disk)] == ["org.apache.spark.SparkException", "java.io.IOException"]
    assert str(cannot_retry(None, disk)) == "No space left on device"
    denied = QueryError(FakeJava("java.nio.file.AccessDeniedException", "/data/checkpoint/offsets/7"))
    assert cannot_retry(None, denied) is not None
    flaky = QueryError(FakeJava("org.apache.spark.SparkException", "Task failed",
                                FakeJava("java.net.ConnectException", "Connection refused")))
    assert cannot_retry(None, flaky) is None
    # a message that merely quotes the words from a payload (not a Java error) decides nothing
    assert cannot_retry(ValueError("payload said: No space left on device"), None) is None
    assert java_causes(ValueError("plain")) == []


def test_summarize_error_keeps_our_own_line():
    text = "Traceback…\npipeline.errors.SinkError: cannot write sink 'x'\n  at org.apache…"
    assert summarize_error(text) == "cannot write sink 'x'"
    assert summarize_error("") == "unknown error"
