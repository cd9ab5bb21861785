"""What closed readers cost pulsar-lite, and what the keeper's sweep gives back (issue 28).

One embedded broker, one topic. Publishing rate (unbatched, ``--messages`` of 200 bytes, every
ack awaited) and the broker's RSS, measured three times in one run:

1. baseline: no subscription on the topic;
2. after ``--readers`` readers opened and closed as the source's read tasks open them
   (pipeline/source/connection.py ``open_reader``): pulsar-lite keeps each one's subscription;
3. after one sweep of the keeper (pipeline/feed/reader_sweep.py) removed them.

Each figure carries the 1-minute load average. Writes ``bench/results/reader_sweep.json``.

    python -m bench.bench_reader_sweep --readers 3000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench.common import load_average, machine, now_utc, ratio, rss_bytes, write_result  # noqa: E402


def publish_rate(producer, messages: int) -> float:
    started = time.perf_counter()
    for _ in range(messages):
        producer.send_async(b"x" * 200, None)
    producer.flush()
    return messages / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--readers", type=int, default=3000, help="readers opened and closed")
    parser.add_argument("--messages", type=int, default=20_000, help="messages per rate measurement")
    args = parser.parse_args(argv)

    import pulsar

    from pipeline.feed.broker import EmbeddedBroker
    from pipeline.feed.reader_sweep import ReaderSweep
    from pipeline.source.connection import open_reader

    figures = {}
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp, EmbeddedBroker(Path(tmp)) as broker:
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            topic = "persistent://public/default/bench-sweep"
            producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=5000,
                                              block_if_queue_full=True)
            producer.send(b"first")

            def measure(name: str) -> None:
                rate = publish_rate(producer, args.messages)
                figures[name] = {"messages_per_s": round(rate), "broker_rss_mb": round(rss_bytes(broker.process.pid) / 2**20, 1),
                                 "load_1m": load_average()[0]}
                print(f"{name:>32}: {rate:>9,.0f} messages/s, broker {figures[name]['broker_rss_mb']} MB "
                      f"(load {figures[name]['load_1m']})", flush=True)

            measure("no subscriptions")
            started = time.perf_counter()
            for _ in range(args.readers):
                reader = open_reader(broker.service_url, topic, "earliest", client=client)
                reader.read_next(5000)
                reader.close()
            print(f"{args.readers} readers opened and closed in {time.perf_counter() - started:.1f} s", flush=True)
            measure(f"{args.readers} closed readers")
            started = time.perf_counter()
            removed = ReaderSweep(broker.broker_dir, stale_s=0.0).sweep(broker.service_url)
            sweep_s = time.perf_counter() - started
            print(f"the sweep removed {removed} in {sweep_s:.1f} s", flush=True)
            measure("after the sweep")
        finally:
            client.close()
    names = list(figures)
    result = {"date": now_utc(), "machine": machine(), "readers": args.readers, "messages": args.messages,
              "figures": figures, "removed": removed, "sweep_s": round(sweep_s, 2),
              "ratio_closed_to_none": ratio(figures[names[1]]["messages_per_s"], figures[names[0]]["messages_per_s"]),
              "ratio_swept_to_none": ratio(figures[names[2]]["messages_per_s"], figures[names[0]]["messages_per_s"])}
    write_result("reader_sweep", result)
    return result


def table_rows(result: dict) -> list[tuple[str, str, str, str]]:
    """Rows of bench/run.py's table: (figure, with closed readers / after the sweep, no subscription, ratio)."""
    none, closed, swept = (result["figures"][name] for name in result["figures"])

    def value(figures: dict) -> str:
        return f"{figures['messages_per_s']:,} (load {figures['load_1m']:.1f})"

    baseline = f"no subscription {value(none)}"
    return [(f"pulsar-lite publishing with {result['readers']:,} closed readers (messages/s)", value(closed), baseline,
             f"{result['ratio_closed_to_none']:.2f}"),
            ("pulsar-lite publishing after the keeper's sweep (messages/s)", value(swept), baseline,
             f"{result['ratio_swept_to_none']:.2f}")]


if __name__ == "__main__":
    main()
