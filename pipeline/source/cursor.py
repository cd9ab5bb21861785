"""The driver's look-ahead over one topic partition: the ids of the messages ahead of the
committed position, so a batch end can be capped at N rows and the backlog can be reported.

It reads on a connection of its own and reopens its reader when pulsar-lite stalls it or drops
its connection (see the README's pulsar-lite notes). Started with :meth:`PartitionCursor.start`,
it reads in a thread of its own while batches run, so planning a batch waits only for ids
not read yet (it was 10 to 16% of each batch when the look-ahead read during ``latestOffset``).
"""

from __future__ import annotations

import logging
import threading
import time

from pipeline.errors import SourceError
from pipeline.source.reader import client_message_id, close_quietly, id_text, open_on_own_connection, partition_topic

log = logging.getLogger(__name__)


class PartitionCursor:
    """Driver-side look-ahead over one partition of one generation.

    Holds the ids of messages read ahead of ``base_n`` (the client's own id objects, turned into
    text only where a batch ends), at most ``max_ahead`` of them, so ``id_at(n)`` can end a batch
    after any number of rows.
    """

    def __init__(self, service_url: str, topic: str, partition: str, start_id: str, start_n: int, max_ahead: int):
        self.topic, self.partition = topic, partition
        self.base_n, self.base_id = start_n, start_id  # position and id of the last consumed message
        self.max_ahead = max_ahead
        self._ids: list = []
        self._base = client_message_id(start_id)
        self._service_url = service_url
        self._client, self._reader = open_on_own_connection(service_url, partition_topic(topic, partition), start_id)
        self._stall_checked = time.monotonic()
        self.redelivered = self._redelivered_logged = 0  # messages the reader sent twice
        self.at_end = False  # the last read waited at the end of the partition
        # Guards the ids and the base; the background reader (start) notifies each read through it.
        self._changed = threading.Condition(threading.RLock())
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._error: Exception | None = None

    def start(self) -> "PartitionCursor":
        """Read ahead in a background thread from now on (only it calls :meth:`poll` then)."""
        self._thread = threading.Thread(target=self._read_ahead, daemon=True,
                                        name=f"look-ahead {self.topic} {self.partition}")
        self._thread.start()
        return self

    def _read_ahead(self) -> None:
        while not self._stopping.is_set():
            try:
                # blocking reads release the GIL; a quiet partition is asked again every 50 ms
                self.poll(budget_s=0.05, first_wait_ms=50 if self.at_end else 20)
            except Exception as exc:  # the planner raises it (broker down: the restart strategy)
                with self._changed:
                    self._error = exc
                    self._changed.notify_all()
                return
            with self._changed:
                self._changed.notify_all()
                while len(self._ids) >= self.max_ahead and not self._stopping.is_set():
                    self._changed.wait(0.5)  # full: wait for advance_to

    def wait_for(self, until_n: int | None, budget_s: float) -> None:
        """Return once position ``until_n`` is known (None: ``max_ahead`` ids are held), the reader
        is at the end of the partition, or ``budget_s`` has passed (background reading; raises
        what stopped the reader)."""
        deadline = time.monotonic() + budget_s
        with self._changed:
            while (self._error is None and not self.at_end
                   and self.known_n < (self.base_n + self.max_ahead if until_n is None else until_n)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(remaining)
            if self._error is not None:
                raise self._error

    @property
    def known_n(self) -> int:
        """The newest position seen so far (a lower bound of the latest position)."""
        with self._changed:
            return self.base_n + len(self._ids)

    def _newest(self):
        return self._ids[-1] if self._ids else self._base

    def matches(self, start_id: str, start_n: int) -> bool:
        return self.base_n <= start_n <= self.known_n and self.id_at(start_n) == start_id

    def id_at(self, n: int) -> str:
        with self._changed:
            if n == self.base_n:
                return self.base_id
            return id_text(self._ids[n - self.base_n - 1])

    def advance_to(self, n: int) -> None:
        """Forget ids up to position ``n`` (consumed by a planned batch)."""
        with self._changed:
            if n <= self.base_n:
                return
            self.base_id = self.id_at(n)
            self._base = self._ids[n - self.base_n - 1]
            del self._ids[:n - self.base_n]
            self.base_n = n
            self._changed.notify_all()  # room again for a background reader that filled up

    def poll(self, budget_s: float = 1.0, first_wait_ms: int = 20) -> int:
        """Read ahead for up to ``budget_s``, until nothing more is there, or until ``max_ahead``
        ids are held; returns rows read."""
        import pulsar

        read = 0
        deadline = time.monotonic() + budget_s
        wait_ms = first_wait_ms
        ids, changed, max_ahead = self._ids, self._changed, self.max_ahead
        reached_end = False
        with changed:
            newest = self._newest()
            full = len(ids) >= max_ahead
        while not full and time.monotonic() < deadline:
            try:
                # the wrapped C++ reader: pulsar-client's Python wrapper costs a call per message
                mid = self._reader._reader.read_next(wait_ms).message_id()
            except pulsar.Timeout:
                if not self._reader.is_connected():
                    self._reconnect()
                    continue
                reached_end = True
                break
            except Exception as exc:
                raise SourceError(f"reading ahead on {self.topic!r} partition {self.partition} failed: {exc}") from exc
            if not newest < mid:
                # pulsar-lite 0.2.0 sometimes sends whole entries again to a busy reader;
                # counting a message twice would shift every later position.
                self.redelivered += 1
                continue
            with changed:  # one lock a message: advance_to (the planner) may shrink the list meanwhile
                ids.append(mid)
                full = len(ids) >= max_ahead
            newest = mid
            read += 1
            wait_ms = 2  # the receiver queue is warm; a short wait means we reached the end
        self.at_end = reached_end
        if self.redelivered >= self._redelivered_logged + 10_000:
            log.info("reader on %r partition %s: %d messages sent again so far, skipped", self.topic,
                     self.partition, self.redelivered)
            self._redelivered_logged = self.redelivered
        # Only a poll that waited at the end counts as idle (stopping at a limit is not a stall);
        # asking the broker costs a round trip, so at most every 2 s.
        if reached_end and not read and time.monotonic() - self._stall_checked > 2.0:
            self._stall_checked = time.monotonic()
            self._reopen_if_stalled()
        return read

    def _reconnect(self) -> None:
        """Open a new connection and reader at the newest id seen, or fail if the broker is gone.

        pulsar-lite 0.2.0 drops a connection when a reader's automatic cumulative ack puts its
        subscription in a state it cannot convert ("out of range integral type conversion"), and
        the client's own reconnect resubscribes under the same name, whose dispatch then keeps
        failing. A new reader is a new subscription, so it reads on; a broker that is really
        down fails to open one, and that failure goes to the restart strategy.
        """
        log.warning("reader on %r partition %s lost its connection; reopening at %s", self.topic, self.partition,
                    self.id_at(self.known_n))
        self._close_connection()
        try:
            self._open_at_newest()
        except SourceError as exc:
            raise SourceError(f"lost the connection to the broker while reading {self.topic!r}: {exc}") from None

    def _open_at_newest(self) -> None:
        self._client, self._reader = open_on_own_connection(
            self._service_url, partition_topic(self.topic, self.partition), self.id_at(self.known_n))

    def _reopen_if_stalled(self) -> None:
        """Reopen the reader at the newest id seen if the broker has messages it does not deliver.

        Seen on pulsar-lite: a reader that stays idle while its topic holds unread messages (see
        the README's pulsar-lite notes for why). Asking costs one round trip, at most every 2 s.
        """
        try:
            waiting = self._reader.has_message_available()
        except Exception:  # pulsar-lite raises on an empty topic
            return
        if waiting:
            log.warning("reader on %r partition %s stalled; reopening at %s", self.topic, self.partition,
                        self.id_at(self.known_n))
            self._close_connection()
            self._open_at_newest()

    def close(self) -> None:
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)  # a read waits 50 ms at most
        self._close_connection()

    def _close_connection(self) -> None:
        close_quietly(self._reader, self._client)
