"""How the job and the SQL pipelines are run: restarts, what cannot be retried, signals, start-up.

:class:`Supervisor` runs one streaming query until it is stopped, restarting it from its
checkpoint after a failure up to ``job.restart.attempts`` times, ``job.restart.delay`` apart;
each start, restart, stop and failure is an event in the metrics store, told with the query's
:class:`Lifecycle` (``job_failed`` / ``sql_failed`` …). Some failures cannot be fixed by a
restart: a sink that cannot be written (:class:`~pipeline.errors.SinkError`), a full disk, a
read-only or forbidden folder. Those stop it at once (:func:`cannot_retry`), decided by the
exception's type: the batch function's own error as it raised it (:meth:`Supervisor.batch`
keeps it; Spark hands the query only its text), and the JVM's cause chain for Spark's own
writes (checkpoint, state), where the OS error reaches Java as an ``IOException`` whose message
is the OS's text for the error number.

Also here: the checkpoint layout marker (a checkpoint written by another state layout is
refused in one line), signal handling, finishing the batch in flight on stop, the start-up
clock and the one-line summary of a Java- and Python-wrapped error.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pipeline.errors import ConfigError, SinkError, StatefulStreamsError

log = logging.getLogger(__name__)

# Errors a restart cannot fix: the folder is full, read-only or not ours to write.
FATAL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
# Java's file errors that say the same by their type.
FATAL_JAVA_TYPES = ("java.nio.file.AccessDeniedException", "java.nio.file.ReadOnlyFileSystemException")


@dataclass(frozen=True)
class Lifecycle:
    """How one kind of query tells its life in events and errors."""

    label: str  # "job", "SQL pipeline 'counts'": starts every message
    failed_kind: str  # the event of a failure for good ("job_failed")
    stopped_kind: str  # the event of a clean stop ("job_stopped")
    failed_error: type[StatefulStreamsError]  # raised when the restarts are spent


def cannot_retry(batch_failure: BaseException | None, query_error: BaseException | None) -> BaseException | None:
    """The failure a restart cannot fix, or None: the batch function's own error when it is a
    SinkError or an OS error of :data:`FATAL_ERRNOS`, else the first of the JVM's causes that is
    (by type, or an IOException carrying one of those errors' OS text)."""
    if isinstance(batch_failure, SinkError):
        return batch_failure
    if isinstance(batch_failure, OSError) and batch_failure.errno in FATAL_ERRNOS:
        return batch_failure
    texts = {os.strerror(number) for number in FATAL_ERRNOS}
    for java_type, message in java_causes(query_error):
        if java_type in FATAL_JAVA_TYPES or (java_type.startswith("java.") and
                                              any(text in (message or "") for text in texts)):
            return OSError(next((text for text in texts if text in (message or "")), java_type))
    return None


def java_causes(error: BaseException | None, limit: int = 20) -> list[tuple[str, str | None]]:
    """(class name, message) along the Java cause chain of a PySpark error ([] for a Python one)."""
    causes, java = [], getattr(error, "_origin", None)
    while java is not None and len(causes) < limit:
        try:
            causes.append((java.getClass().getName(), java.getMessage()))
            java = java.getCause()
        except Exception:  # a py4j object we cannot walk further
            break
    return causes


def summarize_error(text: str) -> str:
    """One line for an operator from a (possibly Java- and Python-wrapped) exception text."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    for pattern in (r"^pipeline\.errors\.\w+: .+", r"^\w*(Error|Exception): .+"):
        found = [line for line in lines if re.match(pattern, line)]
        if found:  # our own errors (a sink's, raised in foreachBatch) read without their class name
            return re.sub(r"^pipeline\.errors\.\w+: ", "", found[-1])[:500]
    return (lines[0] if lines else "unknown error")[:500]


class Supervisor:
    """Runs a streaming query until stopped; restarts it after failures a restart can fix."""

    def __init__(self, lifecycle: Lifecycle, stop: threading.Event, attempts: int, delay_s: float,
                 record: Callable[..., None], data_dir: Path):
        self.lifecycle, self.stop, self.attempts, self.delay_s = lifecycle, stop, attempts, delay_s
        self.record, self.data_dir = record, data_dir
        self.batch_failure: BaseException | None = None

    def batch(self, write: Callable[[object, int], None]) -> Callable[[object, int], None]:
        """``write`` (a foreachBatch function) keeping the error it raises, with its type."""
        def guarded(frame, batch_id: int) -> None:
            try:
                write(frame, batch_id)
            except BaseException as exc:
                self.batch_failure = exc
                raise
        return guarded

    def run(self, start: Callable[[], object], committed: Callable[[], int],
            failure: Callable[[], BaseException | None] = lambda: None,
            after_stop: Callable[[], None] = lambda: None) -> None:
        """Start the query (``start``), wait, restart, until it is stopped or fails for good.

        ``committed`` gives the checkpoint's last committed batch (for the stop event);
        ``failure`` a failure the query's own threads found (a sink that could not be published)
        that stops it; ``after_stop`` runs after a clean stop.
        """
        from pyspark.errors import StreamingQueryException

        name, attempt = self.lifecycle.label, 0
        while True:
            self.batch_failure = None
            query = start()
            try:
                while query.isActive and not self.stop.is_set() and failure() is None:
                    query.awaitTermination(0.5)
                if failure() is not None:
                    finish_batch_in_flight(query)
                    query.stop()
                    error = failure()
                    self.record(self.lifecycle.failed_kind, f"{name} stopped: {error}", error=str(error))
                    raise error if isinstance(error, StatefulStreamsError) else SinkError(str(error))
                if self.stop.is_set():
                    finish_batch_in_flight(query)
                    query.stop()
                    self.record(self.lifecycle.stopped_kind, f"{name} stopped after batch {committed()}")
                    after_stop()
                    return
                query.awaitTermination()  # re-raises the query's failure, if any
                return
            except StreamingQueryException as exc:
                error = summarize_error(exc.getMessage() if hasattr(exc, "getMessage") else str(exc))
                fatal = cannot_retry(self.batch_failure, exc)
                if fatal is not None:
                    if not isinstance(fatal, SinkError):  # Spark's own write failed; its text names no path
                        error = (f"{fatal} while writing under {str(self.data_dir)!r} (checkpoint, sinks, "
                                 "metrics or Spark's scratch); free space or fix the folder, then run the job "
                                 "again")
                    self.record(self.lifecycle.failed_kind, f"{name} stopped: {error}", error=error)
                    raise (SinkError if isinstance(fatal, SinkError) else self.lifecycle.failed_error)(error) from None
                attempt += 1
                if attempt > self.attempts:
                    self.record(self.lifecycle.failed_kind, f"{name} failed after {self.attempts} restarts: {error}",
                                error=error)
                    raise self.lifecycle.failed_error(
                        f"{name} failed after {self.attempts} restart attempts: {error}") from None
                self.record("restart", f"restart {attempt}/{self.attempts} in {self.delay_s:g}s after: {error}",
                            attempt=attempt, max_attempts=self.attempts, error=error, delay_s=self.delay_s)
                log.warning("%s failed (%s); restart %d/%d in %gs", name, error, attempt, self.attempts, self.delay_s)
                if self.stop.wait(self.delay_s):
                    self.record(self.lifecycle.stopped_kind, f"{name} stopped while waiting to restart")
                    return


def finish_batch_in_flight(query, timeout_s: float = 30.0) -> None:
    """Wait, up to ``timeout_s``, for the micro-batch being run to commit, so that stopping the
    query cancels no work (a cancelled batch is redone after a restart, but fills the log with
    Spark's and py4j's traces)."""
    def last_batch() -> int:
        progress = query.lastProgress
        return progress["batchId"] if progress else -1

    # Only the batch running now: with timers pending, Spark starts the next batch right after
    # it, so "no trigger active" may never be seen.
    running = last_batch()
    deadline = time.monotonic() + timeout_s
    while (query.isActive and query.status.get("isTriggerActive") and last_batch() == running
           and time.monotonic() < deadline):
        time.sleep(0.1)


def stop_on_signals(stop: threading.Event) -> None:
    """Ctrl-C and SIGTERM set ``stop`` (only the main thread may install signal handlers)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())


class StartupClock:
    """Seconds each start-up phase took, from the process's own start (imports included)."""

    def __init__(self):
        self.phases = {"process_and_imports": round(process_age_s(), 2)}
        self._last = time.monotonic()

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = round(now - self._last, 2)
        self._last = now

    def total_s(self) -> float:
        return sum(self.phases.values())


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc; 0 where there is none)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


CHECKPOINT_LAYOUT = "changelog-lookup-v1"  # what the state in a checkpoint was written by
EVENT_TIME_LAYOUT = "versioned-lookup-v5"  # enrichment.time = event: versions per key, another state shape
# (v2: the newest version in a head value beside the list of older ones, one timer per key;
# v3: the newest few versions in the head, the list only for older ones;
# v4: the head records two timers, pruning and waiting orders;
# v5: the head holds the first few waiting orders, the list only the rest)


def check_checkpoint_layout(checkpoint: Path, layout: str = CHECKPOINT_LAYOUT) -> None:
    """Refuse a checkpoint whose state an older job layout wrote; mark a fresh one as ours.

    The bucketed Python lookups kept their state in another shape, which Spark cannot read
    into the JVM operator; their checkpoints carry no layout file.
    """
    from pipeline.sinks import last_committed_batch

    marker = checkpoint / "layout"
    if marker.is_file() and marker.read_text().strip() == layout:
        return
    if last_committed_batch(checkpoint) >= 0:
        found = marker.read_text().strip() if marker.is_file() else "the bucketed Python lookups (before the JVM operator)"
        raise ConfigError(f"checkpoint {str(checkpoint)!r} was written by {found} and cannot be restored into "
                          f"this job; move it aside (or delete it) to start fresh from the topics")
    checkpoint.mkdir(parents=True, exist_ok=True)
    marker.write_text(layout + "\n")
