"""Backlog (issue 25): orders/s draining a backlog published unbatched, beside the same backlog batched.

pulsar-client's Python producer does not batch unless told to, so a backlog from it holds one
message per broker entry; our producers put about 450 orders in an entry. The job's source used
to cap a batch in entries, and an unbatched backlog drained at about 350 orders/s. This measures
the cap in messages (``job.max_rows_per_batch``, ``job.max_bytes_per_batch``) on both:

1. one embedded broker is loaded, before any job runs, with the same generated users, items and
   orders (pipeline/feed/datagen.py) twice: on one set of topics with ``client.create_producer(topic)``
   and no batching arguments (``send_async``, ``block_if_queue_full``), on another batched as
   bench_throughput.py publishes; the publishing is timed;
2. the job (``python -m pipeline run`` in its own process, ``local[2]``, ``enrichment.max_wait``
   0 s, the caps at their defaults) drains the unbatched backlog from a fresh checkpoint, then
   another job process the batched one: both start cold, and a job that dies (a JVM out of
   memory) is reported with the batches it planned, and the other backlog is still measured;
3. each drain's rate is its orders over the time from the start of its first batch to the end of
   the last batch with orders (so the batches that load the changelogs count against it), from
   the job's progress rows; beside it, the orders-only rate bench_throughput.py reports
   (``job_figures``: order rows over the summed durations of the batches with orders, the first
   one excluded), the batches and the messages in each;
4. every order must be decided exactly once: enriched + missing_state == orders, with no
   (invoice, line) twice and no dead letter.

Writes ``bench/results/backlog.json``.

    python -m bench.bench_backlog                                # 1M orders, 200k users, 2k items
    python -m bench.bench_backlog --orders 50000 --users 10000   # a quick look
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.bench_throughput import count_lines, job_figures, load_topics  # noqa: E402
from bench.common import (BenchError, alive, bench_topics, load_average, machine, now_utc, ratio,  # noqa: E402
                          start_job, wait_until, write_result)
from pipeline import store  # noqa: E402
from pipeline.feed.broker import EmbeddedBroker  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.feed.datagen import generate  # noqa: E402
from pipeline.metrics import read_rows  # noqa: E402
from pipeline.wire import CHANGELOGS  # noqa: E402

MODES = {"unbatched": False, "batched": True}  # backlog -> published batched; drained in this order


def publish_backlog(url: str, topics: dict, tables: dict, batching: bool) -> dict:
    """Publish every table to its topic; the counts and how long it took, per kind."""
    figures = {"load_average_before": load_average()}
    for kind, topic in topics.items():
        started = time.perf_counter()
        sent = load_topics(url, {kind: topic}, tables, batching=batching)[kind]
        seconds = time.perf_counter() - started
        figures[kind] = {"messages": sent, "s": round(seconds, 1), "messages_per_s": round(sent / seconds)}
    figures["s"] = round(sum(figures[kind]["s"] for kind in topics), 1)
    figures["load_average"] = load_average()
    return figures


def drain(settings, orders: int, timeout_s: float, log_path: Path) -> dict:
    """Run the job (its own process) on a fresh checkpoint until every order is in the sinks;
    its rates, batches and sink counts. If it dies or ``timeout_s`` passes first, ``error`` says
    so and the figures say how far it got, with the batches it planned but never committed."""
    from sinkread import count, orders_done

    load_before = load_average()
    started = time.perf_counter()
    job = start_job(settings, log_path)
    error = None
    try:
        wait_until(lambda: orders_done(settings.data_dir) >= orders, timeout_s, f"the job to drain {orders:,} orders",
                   interval=1, check=alive(job, log_path))
    except BenchError as exc:
        error = str(exc).splitlines()[0].split("; end of ")[0]  # the log is named in "log"
    finally:
        wall = time.perf_counter() - started
        job.stop()
    progress = [p for p in read_rows(settings.data_dir, "progress") if p["num_input_rows"]]
    figures = {**drain_rate(progress), "load_average_before": load_before, "load_average": load_average(),
               "orders_only": job_figures(progress, wall), **batch_sizes(progress, settings["job.max_rows_per_batch"])}
    enriched, missing = count(settings.data_dir, "enriched"), count(settings.data_dir, "missing_state")
    figures.update(enriched=enriched, missing=missing, dead_letter=count(settings.data_dir, "dead_letter"),
                   distinct_orders=distinct_orders(settings.data_dir))
    figures["exactly_once"] = (enriched + missing == figures["distinct_orders"] == orders
                               and figures["dead_letter"] == 0)
    figures["reader_stalls"] = count_lines(log_path, "stalled")
    if error:
        committed = {p["batch_id"] for p in progress}
        figures.update(error=error, log=str(log_path), log_errors=log_errors(log_path),
                       planned_not_committed=[b for b in planned_batches(settings.data_dir) if b["batch"] not in committed],
                       last_reads=last_reads(settings.data_dir))
    return figures


def planned_batches(data_dir) -> list[dict]:
    """What the planner admitted to each batch in Spark's offset log (entries and estimated
    messages per topic), committed or not."""
    planned = []
    for path in sorted((store.checkpoint_dir(data_dir) / "offsets").glob("[0-9]*"), key=lambda p: int(p.name)):
        offset = json.loads(path.read_text().strip().splitlines()[-1])
        planned.append({"batch": int(path.name), **{topic: {"entries": (o.get("admitted") or {}).get("entries"),
                                                           "messages": (o.get("admitted") or {}).get("messages"),
                                                           "end": {p: part["id"] for p, part in o["parts"].items()}}
                                                    for topic, o in offset.items()}})
    return planned


def last_reads(data_dir) -> dict:
    """What the newest range read of each partition held (the planner's samples, planning.py)."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(store.source_stats_dir(data_dir).glob("*.json"))}


def log_errors(log_path: Path, limit: int = 6) -> list[str]:
    """The job log's distinct error lines (a JVM out of memory, a failed query and its restarts)."""
    found: list[str] = []
    for line in Path(log_path).read_text(errors="replace").splitlines():
        if any(word in line for word in ("OutOfMemoryError", "query failed", "TaskResultLost", "giving up")):
            line = line.strip()[:200]
            if line not in found:
                found.append(line)
    return found[:limit]


def rows_of(progress_row: dict, kind: str) -> int:
    return sum(t["rows"] or 0 for t in progress_row["topics"] if t["topic"] == kind)


def drain_rate(progress: list[dict]) -> dict:
    """Orders over first batch start -> end of the last batch with orders (progress rows' times);
    and the orders after the first batch over the time after it (the first batch of a process
    also warms Spark up, and of a cold partition is planned small: planning.cold_size)."""
    with_orders = [p for p in progress if rows_of(p, "orders")]
    if not with_orders:
        return {"orders_per_s": 0.0, "drain_s": None, "changelogs_s": None, "first_batch_s": None,
                "orders_per_s_after_first_batch": None}
    began = progress[0]["ts_ms"]
    ended = with_orders[-1]["ts_ms"] + with_orders[-1]["batch_duration_ms"]
    orders = sum(rows_of(p, "orders") for p in progress)
    warm = progress[0]["ts_ms"] + progress[0]["batch_duration_ms"]  # the first batch also warms Spark up
    after_first = sum(rows_of(p, "orders") for p in progress[1:])
    return {"orders_per_s": orders / ((ended - began) / 1000), "drain_s": round((ended - began) / 1000, 1),
            # until the first batch with orders: the changelogs alone (admitted first)
            "changelogs_s": round((with_orders[0]["ts_ms"] - began) / 1000, 1),
            "first_batch_s": round((warm - began) / 1000, 1),
            "orders_per_s_after_first_batch": after_first / ((ended - warm) / 1000) if ended > warm else None}


def batch_sizes(progress: list[dict], max_rows: int) -> dict:
    """The batches the job ran with messages, and what each held: messages (read) per topic,
    entries (from the offsets' positions), the planner's estimate, duration, orders held back."""
    batches, entries_before = [], {}
    for p in progress:
        row = {"batch": p["batch_id"], "ms": p["batch_duration_ms"],
               **{kind: rows_of(p, kind) for kind in (*CHANGELOGS, "orders")},
               "admitted": sum(t["admitted_messages"] or 0 for t in p["topics"]), "entries": 0,
               "orders_held": p.get("orders_held", False)}
        for t in p["topics"]:
            row["entries"] += t["end_position"] - entries_before.get(t["topic"], 0)
            entries_before[t["topic"]] = t["end_position"]
        row["messages"] = sum(row[kind] for kind in (*CHANGELOGS, "orders"))
        batches.append(row)
    messages = [b["messages"] for b in batches]
    with_orders = [b["orders"] for b in batches if b["orders"]]
    return {"batches": len(batches), "batches_with_orders": len(with_orders),
            "messages_per_batch_mean": round(sum(messages) / len(messages)) if messages else 0,
            "messages_per_batch_max": max(messages, default=0),
            "orders_per_batch_mean": round(sum(with_orders) / len(with_orders)) if with_orders else 0,
            "messages_per_entry": round(sum(messages) / max(1, sum(b["entries"] for b in batches)), 1),
            "batch_ms_mean": round(sum(b["ms"] for b in batches) / len(batches)) if batches else 0,
            # batches over the message cap, and batches that read more than twice what the planner
            # admitted (its estimate of the entries' sizes was off)
            "over_cap": [b["batch"] for b in batches if b["messages"] > max_rows],
            "read_over_admitted": [b["batch"] for b in batches if b["messages"] > 2 * max(b["admitted"], 1)],
            "per_batch": batches}


def distinct_orders(data_dir) -> int:
    """Distinct (invoice, line) over enriched and missing_state: equal to their row count when
    no order was decided twice."""
    import duckdb
    from sinkread import has_files, relation

    parts = [f"select invoice_id, line_item_id from {relation(data_dir, sink)}"
             for sink in ("enriched", "missing_state") if has_files(data_dir, sink)]
    if not parts:
        return 0
    return duckdb.sql(f"select count(*) from (select distinct * from ({' union all '.join(parts)}))").fetchall()[0][0]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=200_000,
                        help="users generated (pipeline/feed/datagen.py: about 1.36 messages each, their versions)")
    parser.add_argument("--items", type=int, default=2_000)
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds each drain may take; past it the figures say how far it got")
    parser.add_argument("--log-dir", type=Path, help="where the jobs' logs go (default: the temp folder)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-backlog-"))
    log_dir = args.log_dir or work.parent
    load_at_start = load_average()
    started = time.perf_counter()
    tables = generate(args.users, args.items, args.orders, seed=7)
    tables = {kind: tables[kind] for kind in (*CHANGELOGS, "orders")}
    published, drained = {}, {}
    try:
        with EmbeddedBroker(work / "broker") as broker:
            topics = {mode: bench_topics(mode) for mode in MODES}
            for mode, batching in MODES.items():
                print(f"publishing the {mode} backlog…", flush=True)
                published[mode] = publish_backlog(broker.service_url, topics[mode], tables, batching)
                print(f"  {published[mode]['s']:.0f}s (load {published[mode]['load_average'][0]})", flush=True)
            for mode in MODES:
                settings = load_settings(env={}, cli={
                    "pulsar.service_url": broker.service_url, "paths.data_dir": str(work / mode),
                    "spark.master": "local[2]", "enrichment.max_wait": "0s",
                    **{f"topics.{kind}": topic for kind, topic in topics[mode].items()}})
                log_path = log_dir / f"{work.name}-{mode}.log"
                print(f"the job drains the {mode} backlog (its log: {log_path})…", flush=True)
                drained[mode] = d = drain(settings, published[mode]["orders"]["messages"], args.timeout, log_path)
                rate = (f"FAILED ({d['error']})" if "error" in d
                        else f"{d['orders_per_s']:,.0f} orders/s over {d['drain_s']}s")
                print(f"  {rate} (load {d['load_average'][0]}): {d['batches']} batches, "
                      f"{d['messages_per_batch_mean']:,} messages each on average; {d['enriched']:,} enriched, "
                      f"{d['missing']:,} missing" + ("" if d["exactly_once"] else "; NOT every order exactly once"),
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # a drain that failed has no rate to compare (its figures still say how far it got)
    unbatched, batched = drained.get("unbatched"), drained.get("batched")
    drained_both = bool(unbatched and batched and "error" not in unbatched and "error" not in batched)
    result = {
        "date": now_utc(), "machine": {**machine(), "load_average_at_start": load_at_start},
        "workload": {kind: tables[kind].rows for kind in tables} | {
            "max_rows_per_batch": settings["job.max_rows_per_batch"],
            "max_bytes_per_batch": settings["job.max_bytes_per_batch"], "enrichment_max_wait": "0s"},
        "published": published, "unbatched": unbatched, "batched": batched,
        "unbatched_vs_batched": ratio(unbatched["orders_per_s"], batched["orders_per_s"]) if drained_both else None,
        "after_first_batch_unbatched_vs_batched": ratio(unbatched["orders_per_s_after_first_batch"],
                                                        batched["orders_per_s_after_first_batch"]) if drained_both else None,
        "orders_only_unbatched_vs_batched": ratio(unbatched["orders_only"]["orders_per_s"],
                                                  batched["orders_only"]["orders_per_s"]) if drained_both else None,
        "exactly_once": bool(unbatched and batched and unbatched["exactly_once"] and batched["exactly_once"]),
        "bench_s": round(time.perf_counter() - started, 1),
    }
    path = write_result("backlog", result)
    print(f"\n{'backlog':<12}{'orders/s':>10}{'load':>6}{'batches':>9}{'msgs/batch':>12}{'orders-only/s':>15}"
          f"{'enriched':>11}{'missing':>9}")
    for mode, d in drained.items():
        print(f"{mode:<12}{d['orders_per_s']:>10,.0f}{d['load_average'][0]:>6.1f}{d['batches']:>9}"
              f"{d['messages_per_batch_mean']:>12,}{d['orders_only']['orders_per_s']:>15,.0f}"
              f"{d['enriched']:>11,}{d['missing']:>9,}")
    if result["unbatched_vs_batched"] is not None:
        print(f"unbatched / batched = {result['unbatched_vs_batched']:.2f} (target >= 0.5, aim 0.8); "
              f"after the first batch {result['after_first_batch_unbatched_vs_batched']}; "
              f"orders-only batches {result['orders_only_unbatched_vs_batched']}")
    print(f"publishing: unbatched {published['unbatched']['s']:.0f}s, batched {published['batched']['s']:.0f}s; "
          f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
