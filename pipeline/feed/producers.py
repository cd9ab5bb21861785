"""The producers: publish users, items or orders as keyed JSON, from a CSV or from memory.

``python -m pipeline produce users|items|orders`` reads ``data/<topic>.csv`` (or ``--file``),
reports each bad row on stderr by file and line and skips it, and publishes the rest to the
configured topic: keyed by ``str(id)`` or ``str(invoiceId)``, batched and asynchronous, in
file order, at most ``--rate`` messages per second. It ends with a summary line and fails
(exit code 2) if the broker did not acknowledge every message it was sent.

:func:`publish_records` is the reusable part, for tests, benchmarks and re-drives: it
validates each record with :func:`pipeline.wire.parse_record`, so nothing half-formed is sent.
The guarantee is at-least-once per call: a message counted in ``sent`` was acknowledged.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from pipeline import wire
from pipeline.feed.csv_records import read_csv_records
from pipeline.errors import BrokerError, StatefulStreamsError
from pipeline.feed.pacing import ProgressBar, TokenBucket

ACK_TIMEOUT_S = 60  # after the last send, how long acknowledgements may take to arrive


@dataclass
class PublishStats:
    """What one publish did. ``sent`` counts acknowledged messages only."""

    topic: str
    rate_limit: float = 0.0  # messages per second; 0 = unlimited
    sent: int = 0
    failed: int = 0  # sends the client or the broker reported as failed
    skipped: int = 0  # invalid records, never sent
    attempted: int = 0  # records handed to the client
    elapsed_s: float = 0.0
    throttled_s: float = 0.0  # of elapsed_s, spent waiting on the rate limit
    first_error: str | None = None
    interrupted: bool = False  # stopped early by Ctrl-C

    @property
    def msgs_per_s(self) -> float:
        return self.sent / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        ended = " (interrupted)" if self.interrupted else ""
        return (f"{self.topic}: sent {self.sent}, skipped {self.skipped}, failed {self.failed} "
                f"in {self.elapsed_s:.1f}s ({self.msgs_per_s:,.0f} msgs/s){ended}")


def create_producer(client, topic_name: str):
    """A batching producer that waits (rather than fails) when its send queue is full."""
    try:
        return client.create_producer(
            topic_name, batching_enabled=True, batching_max_publish_delay_ms=5,
            batching_max_messages=1000, block_if_queue_full=True, max_pending_messages=10_000,
        )
    except Exception as exc:  # the C++ client raises its own error types
        raise BrokerError(f"cannot create a producer for topic {topic_name!r}: {exc}") from exc


def publish_records(client, topic_name: str, kind: str, records: Iterable[dict[str, Any]], rate: float = 0.0,
                    on_progress: Callable[[int], None] | None = None, *, limit: int = 0,
                    on_skip: Callable[[str], None] | None = None, checked: bool = False,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> PublishStats:
    """Publish ``records`` of ``kind`` to ``topic_name`` in order; return once all are acknowledged.

    Each record is checked with ``wire.parse_record`` (a bad one is counted in ``skipped`` and
    described to ``on_skip``), unless ``checked`` says that was done already (rows from
    ``read_csv_records``); it is encoded as compact JSON and keyed with ``wire.message_key``.
    ``rate`` > 0 paces the sends with a token bucket; ``limit`` > 0 stops after that many sends;
    ``on_progress(attempted)`` is called after each send. Ctrl-C stops the sending early, and
    what was already handed to the client is still flushed and counted.
    """
    import pulsar

    stats = PublishStats(topic=topic_name, rate_limit=rate)
    done = threading.Condition()

    def on_ack(result, _message_id) -> None:  # runs on the client's I/O thread
        with done:
            if result == pulsar.Result.Ok:
                stats.sent += 1
            else:
                stats.failed += 1
                stats.first_error = stats.first_error or getattr(result, "name", str(result))
            done.notify_all()

    producer = create_producer(client, topic_name)
    started = clock()
    bucket = TokenBucket(rate, now=started) if rate > 0 else None
    try:
        for index, raw in enumerate(records):
            if limit and stats.attempted >= limit:
                break
            try:
                record = raw if checked else wire.parse_record(kind, raw)
            except wire.BadMessage as exc:
                stats.skipped += 1
                if on_skip:
                    on_skip(f"record {index}: {exc}")
                continue
            if bucket is not None:
                wait = bucket.take(clock())
                if wait > 0:
                    sleep(wait)
                    stats.throttled_s += wait
            try:
                producer.send_async(wire.encode(record), on_ack, partition_key=wire.message_key(kind, record))
            except Exception as exc:  # refused before it left, e.g. the producer was closed
                with done:
                    stats.failed += 1
                    stats.first_error = stats.first_error or str(exc)
            stats.attempted += 1
            if on_progress:
                on_progress(stats.attempted)
    except KeyboardInterrupt:
        stats.interrupted = True
    finally:
        try:
            producer.flush()
        except Exception as exc:  # the failed sends also reach on_ack; keep the first cause
            stats.first_error = stats.first_error or str(exc)
        with done:
            done.wait_for(lambda: stats.sent + stats.failed >= stats.attempted, timeout=ACK_TIMEOUT_S)
        stats.elapsed_s = clock() - started
        producer.close()
    return stats


def loop_orders(read_round: Callable[[int], Iterable[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """Orders from ``read_round(0)``, ``read_round(1)``, … for demos that should not run dry.

    Every later round shifts the invoice ids past all earlier rounds, so its orders are new
    invoices rather than duplicates. Stops if a round yields nothing.
    """
    low = high = 0
    round_no = 0
    while True:
        count = 0
        for record in read_round(round_no):
            invoice = record["invoiceId"]
            if round_no == 0:
                low, high = (invoice, invoice) if count == 0 else (min(low, invoice), max(high, invoice))
            else:
                record = {**record, "invoiceId": invoice + round_no * (high - low + 1)}
            count += 1
            yield record
        if count == 0:
            return
        round_no += 1


def count_data_lines(path: Path) -> int:
    """Lines after the header, for the progress bar (a quoted multi-line cell counts twice)."""
    lines = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 22):
            lines += chunk.count(b"\n")
    return max(0, lines - 1)


def main(args, settings) -> None:
    """``python -m pipeline produce``: publish a CSV to its topic with a progress bar."""
    from pipeline.feed.broker import resolve_service_url
    from pipeline.feed.topics import make_client

    kind = args.topic
    if args.loop and kind != "orders":
        raise StatefulStreamsError(f"--loop works for orders only, not {kind!r}: a changelog replayed in a loop "
                                   "would only repeat the same versions")
    path = Path(args.file or Path("data") / f"{kind}.csv")
    rows = read_csv_records(path, kind)  # fails now, before connecting, on a missing file or a bad header
    total = None if args.loop else count_data_lines(path)
    if args.limit:
        total = args.limit if total is None else min(total, args.limit)
    bar = None if args.quiet else ProgressBar(f"{path.name} -> {kind}", total=total)
    report = bar.message if bar else (lambda line: print(line, file=sys.stderr))
    skipped = 0

    def good_records(round_no: int) -> Iterator[dict[str, Any]]:
        nonlocal skipped
        for row in rows if round_no == 0 else read_csv_records(path, kind):
            if row.error is None:
                yield row.record
            elif round_no == 0:  # a loop's later rounds have the same bad rows: report them once
                skipped += 1
                report(row.error)

    records = loop_orders(good_records) if args.loop else good_records(0)
    client = make_client(resolve_service_url(settings), token=settings["pulsar.auth_token"])
    try:
        stats = publish_records(client, settings.topics[kind], kind, records, rate=args.rate,
                                on_progress=(lambda sent: bar.update(sent + skipped)) if bar else None,
                                limit=args.limit, checked=True)
    finally:
        if bar is not None:
            bar.close()
        client.close()
    stats.skipped += skipped
    print(stats.summary())
    if stats.failed:
        raise BrokerError(f"{stats.failed} of {stats.attempted} messages to {stats.topic!r} were not acknowledged "
                          f"(first error: {stats.first_error}); check the broker and publish again")
