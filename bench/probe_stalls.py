"""Probe: how often pulsar-lite stalls range readers, with one or more processes reading at once.

Publishes ``ORDERS`` generated orders to one topic (or two with ``--two-topics``), then each of
``--processes`` processes reads ``--reads`` ranges of 10 entries from random places with
``read_range`` (a reader on its own connection per range) and counts the reopened stalls.

    python -m bench.probe_stalls 400000 --processes 2 --reads 150
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]


def read_ranges(url: str, topic: str, ledger: int, entries: int, seed: int, reads: int, results) -> None:
    from pipeline.source import offsets as off
    from pipeline.source.reader import _RangeStream, read_range

    rnd = random.Random(seed)
    for _ in range(reads):
        first = rnd.randrange(0, entries - 12)
        rng = off.Range("orders", "-1", 0, f"{ledger}:{first}:-1:-1", 0, f"{ledger}:{first + 10}:-1:-1", 10)
        for _batch in read_range(url, topic, "orders", rng):
            pass
    results.put(_RangeStream.stalls)


def main(argv=None) -> dict:
    from bench.common import table_records
    from pipeline.broker import EmbeddedBroker
    from pipeline.datagen import generate
    from pipeline.producers import publish_records
    from pipeline.source.probes import last_entry_id
    from pipeline.topics import make_client

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("orders", type=int)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--reads", type=int, default=150, help="ranges each process reads")
    parser.add_argument("--two-topics", action="store_true", help="odd processes read a second topic")
    args = parser.parse_args(argv)
    with EmbeddedBroker(Path(tempfile.mkdtemp(prefix="probe-stalls-"))) as broker:
        url, names = broker.service_url, ["persistent://public/default/stalls-a", "persistent://public/default/stalls-b"]
        names = names if args.two_topics else names[:1]
        records = table_records(generate(1000, 100, args.orders, seed=7)["orders"])
        client = make_client(url)
        for name in names:
            publish_records(client, name, "orders", records)
        client.close()
        topics = []
        for name in names:
            ledger, entry = (int(x) for x in last_entry_id(url, name, "-1").split(":")[:2])
            topics.append((name, ledger, entry + 1))
        ctx = mp.get_context("spawn")  # a forked pulsar client is not usable
        results = ctx.Queue()
        procs = [ctx.Process(target=read_ranges, args=(url, topics[i % len(topics)][0], topics[i % len(topics)][1],
                                                      min(t[2] for t in topics), i, args.reads, results))
                 for i in range(args.processes)]
        started = time.perf_counter()
        for proc in procs:
            proc.start()
        stalls = sum(results.get() for _ in procs)
        for proc in procs:
            proc.join()
    figures = {"processes": args.processes, "topics": len(names), "reads": args.reads * args.processes,
               "stalls": stalls, "wall_s": round(time.perf_counter() - started, 1), "load_average": os.getloadavg()}
    print(figures)
    return figures


if __name__ == "__main__":
    main()
