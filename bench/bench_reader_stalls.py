"""Range reader stalls (issue 12, item 3): how often a range reader goes silent with messages
left to read, by receiver queue size, with several processes reading at once as Spark's tasks do.

Why a reader stalls, from pulsar-lite 0.2.0's source (``ascentstream/pulsar-lite``; the
README's pulsar-lite notes): the broker's exclusive dispatcher stops sending when the
connection's outbound buffer is over its high-water mark, and nothing starts it again when
the buffer drains. Only a FLOW from the client (sent once the application has taken half of
the receiver queue since the last one) or a new publish does. The broker also counts permits
per *entry* while the client grants them per *message*, so a reader of batched entries is
never held back by permits and runs into the buffer limit instead. If the buffered messages
are fewer than half the receiver queue, the client never sends the FLOW, and the reader waits
until ``_RangeStream`` reopens it after 1.5 s of silence. A smaller receiver queue sends FLOWs
more often; measured (bench/README.md, stop 21), it stalled as rarely and read 20% slower, so
the source keeps 5,000 and its 1.5 s watchdog.

One embedded broker holds ``--orders`` orders, published by the job's own batching producer.
For each receiver queue size (5,000, what the source used up to now, is the baseline),
``--processes`` processes at once each read ``--reads`` ranges of ``--range-rows`` messages at
random places with the source's own ``read_range``. A stall is one of its "stalled" warnings.
Each range's time to its first Arrow batch (opening a connection and a reader) is reported
apart from its rate after that. Prints a table and writes ``bench/results/reader_stalls.json``.

    python -m bench.bench_reader_stalls                 # 300k orders, 2 processes x 40 reads
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.common import bench_topics, machine, now_utc, table_records, write_result  # noqa: E402
from pipeline.feed.broker import EmbeddedBroker  # noqa: E402
from pipeline.feed.datagen import generate  # noqa: E402
from pipeline.feed.producers import publish_records  # noqa: E402
from pipeline.source import connection, reader as rd  # noqa: E402
from pipeline.source.offsets import EARLIEST, Range  # noqa: E402
from pipeline.feed.topics import make_client  # noqa: E402

NAME = "reader_stalls"
QUEUES = (5000, 1000)


def message_ids(url: str, topic: str, count: int) -> list[str]:
    """Every message id of the topic in order (one pass with a plain reader)."""
    import pulsar

    client = connection.new_client(url)
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=5000)
    ids: list[str] = []
    try:
        while len(ids) < count:
            found = reader.read_next(10_000).message_id()
            if not ids or connection.client_message_id(ids[-1]) < found:  # skip entries sent again
                ids.append(connection.id_text(found))
    finally:
        client.close()
    return ids


class _StallCount(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.stalls = 0

    def emit(self, record):
        if "stalled" in record.getMessage():
            self.stalls += 1


def read_ranges(url: str, topic: str, ranges: list[Range], queue: int) -> dict:
    """One process's share: read each range with ``read_range``; stalls and timings."""
    rd.RANGE_RECEIVER_QUEUE = queue
    counter = _StallCount()
    logging.getLogger(rd.__name__).addHandler(counter)
    first_ms, rates, rows = [], [], 0
    started = time.perf_counter()
    for rng in ranges:
        begin = time.perf_counter()
        batches = rd.read_range(url, topic, "orders", rng)
        got = next(batches).num_rows
        first = time.perf_counter()
        got += sum(batch.num_rows for batch in batches)
        end = time.perf_counter()
        if got != rng.count:
            raise RuntimeError(f"read {got} rows of a {rng.count}-row range")
        first_ms.append((first - begin) * 1000)
        rates.append((got - min(got, rd.ARROW_BATCH_ROWS)) / max(end - first, 1e-9))
        rows += got
    return {"stalls": counter.stalls, "rows": rows, "seconds": time.perf_counter() - started,
            "first_batch_ms": first_ms, "rows_per_s_after_first": rates}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=300_000)
    parser.add_argument("--processes", type=int, default=2, help="processes reading at once (default 2, the cores)")
    parser.add_argument("--reads", type=int, default=40, help="ranges each process reads per queue size")
    parser.add_argument("--range-rows", type=int, default=12_500, help="messages in a range (the job's splitRows)")
    parser.add_argument("--queues", default=",".join(map(str, QUEUES)), help="receiver queue sizes to compare")
    args = parser.parse_args(argv)
    queues = [int(q) for q in args.queues.split(",")]
    chooser = random.Random(11)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="bench-stalls-") as tmp:
        broker = EmbeddedBroker(Path(tmp) / "broker").start()
        try:
            topic = bench_topics("stalls")["orders"]
            client = make_client(broker.service_url)
            try:
                tables = generate(1000, 100, args.orders, seed=7)
                sent = publish_records(client, topic, "orders", table_records(tables["orders"])).sent
            finally:
                client.close()
            ids = message_ids(broker.service_url, topic, sent)
            print(f"published and indexed {sent:,} orders", flush=True)
            context = multiprocessing.get_context("spawn")  # no client threads cross a fork
            with context.Pool(args.processes) as pool:
                for round_ in range(2):  # each size twice, interleaved, so a busy moment hits all alike
                    for queue in queues:
                        shares = []
                        for _ in range(args.processes):
                            share = []
                            for _ in range(args.reads // 2):
                                start = chooser.randrange(0, sent - args.range_rows)
                                share.append(Range("orders", "-1", 0, ids[start - 1] if start else EARLIEST, start,
                                                   ids[start + args.range_rows - 1], start + args.range_rows))
                            shares.append((broker.service_url, topic, share, queue))
                        for result in pool.starmap(read_ranges, shares):
                            run = runs.setdefault(queue, {"stalls": 0, "rows": 0, "first_batch_ms": [],
                                                          "rows_per_s_after_first": [], "reads": 0})
                            run["stalls"] += result["stalls"]
                            run["rows"] += result["rows"]
                            run["reads"] += len(result["first_batch_ms"])
                            run["first_batch_ms"] += result["first_batch_ms"]
                            run["rows_per_s_after_first"] += result["rows_per_s_after_first"]
        finally:
            broker.stop()
    summary = {queue: {"reads": run["reads"], "rows": run["rows"], "stalls": run["stalls"],
                       "first_batch_ms_median": round(statistics.median(run["first_batch_ms"]), 1),
                       "first_batch_ms_p90": round(statistics.quantiles(run["first_batch_ms"], n=10)[-1], 1),
                       "rows_per_s_after_first_median": round(statistics.median(run["rows_per_s_after_first"]))}
               for queue, run in runs.items()}
    baseline = summary[queues[0]]
    print(f"{'receiver queue':<16}{'reads':>7}{'stalls':>8}{'first batch ms (median / p90)':>32}{'rows/s after':>14}")
    for queue, row in summary.items():
        print(f"{queue:<16}{row['reads']:>7}{row['stalls']:>8}"
              f"{row['first_batch_ms_median']:>20.1f} / {row['first_batch_ms_p90']:<9.1f}"
              f"{row['rows_per_s_after_first_median']:>14,}")
    result = {"measured_at": now_utc(), "machine": machine(), "orders": args.orders, "processes": args.processes,
              "range_rows": args.range_rows, "baseline_queue": queues[0],
              "by_receiver_queue": {str(q): row for q, row in summary.items()},
              "stalls_vs_baseline": {str(q): (row["stalls"], baseline["stalls"]) for q, row in summary.items()}}
    write_result(NAME, result)
    return result


if __name__ == "__main__":
    main()
