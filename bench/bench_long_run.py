"""An hour of the real job: every process's memory, the disk and the console's pages, at the start and the end.

Issue 28's long run. Everything runs as it does in ``make demo``, each part its own process on
127.0.0.1: the embedded broker, the job (``python -m pipeline run``, local[2], trigger
``--trigger``, default 0.5 s; every other setting the job's default unless ``--set``), the
orders producer (``python -m pipeline produce orders --rate 2000 --loop`` over a generated CSV)
and the Prometheus exporter (``python -m app.exporter``, scraped every ``--scrape-seconds``
as Prometheus would). The users and items are published first and loaded by the job.

- **Every ``--sample-seconds``**: the RSS of each process (the job's driver, JVM and Python
  workers apart, and their PSS), the files and bytes of each sink (current table files, Parquet
  files on disk, the Delta log), of each metrics stream, of the checkpoint and of the broker,
  the newest batch (its id, duration and the orders backlog) and the load average; every
  ``--live-heap-minutes`` also the job JVM's native memory (``--nmt``), its heap committed and its
  live heap after a full collection (jcmd), which its RSS hides (bench/long_run_samples.py).
- **At the start** (after ``--warmup-seconds``) **and at the end**: every console page with
  Streamlit's AppTest (cold, warm and cached, as bench/bench_console.py times them), the
  exporter's scrape time, and a DuckDB count over each sink.

"Nothing may grow beyond what retention allows": the verdict checks what must stay flat (each
process's memory; the checkpoint; each sink's current files, which compaction bounds) and
reports what grows by design at the rate the retentions allow (sink Parquet files that vacuum
keeps ``sinks.vacuum_retention``, the Delta log kept an hour or back to the oldest savepoint,
metrics day files kept ``metrics.retention``, the broker's topics kept forever), with a
projection to a day. The bounds are in :func:`judge`. A run shorter than an hour is marked
``partial`` in its JSON. Writes ``bench/results/long_run.json``.

    python -m bench.bench_long_run                    # the hour
    python -m bench.bench_long_run --minutes 10 --out /tmp/look.json   # a partial look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.common import (BenchError, alive, bench_topics, load_average, machine, now_utc, percentile,  # noqa: E402
                          wait_until, write_result)
from bench.long_run_samples import job_parts, judge_jvm, sample  # noqa: E402
from bench.jvm_env import driver_jvm_environment  # noqa: E402
from pipeline import store  # noqa: E402
from pipeline.config import load_settings  # noqa: E402
from pipeline.feed.broker import EmbeddedBroker, die_with_parent  # noqa: E402
from pipeline.feed.ports import find_free_port  # noqa: E402
from pipeline.metrics import read_rows  # noqa: E402
from pipeline.metrics_tail import parse_lines, tail_lines  # noqa: E402

NAME = "long_run"
HOUR_MIN = 60
PAGE_LIMIT_S = 1.5  # bench_month's target for every page
PAGE_GROWTH = 2.0  # a page's warm time at the end over the start, at most
# What must stay flat: the end over the start, at most this much more (or the absolute slack).
MEMORY_GROWTH, MEMORY_SLACK_MB = 0.25, 100.0
CHECKPOINT_GROWTH, CHECKPOINT_SLACK_MB = 0.5, 50.0
NMT_OPTION = "-XX:NativeMemoryTracking=summary"  # a few MB and about 1% of the JVM's time (its own category)
MEASURING = "bench (AppTest, scrapes)"  # this process: it times the pages, so it holds Streamlit


# ---------------------------------------------------------------------------- the processes
def child_env(settings) -> dict[str, str]:
    """The settings a child process needs, as SS_* variables (no secrets are set here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SS_")}
    env.update({"SS_PULSAR_SERVICE_URL": settings.service_url, "SS_PATHS_DATA_DIR": str(settings.data_dir),
                "SS_TOPICS_USERS": settings.topics["users"], "SS_TOPICS_ITEMS": settings.topics["items"],
                "SS_TOPICS_ORDERS": settings.topics["orders"], "PYTHONPATH": str(ROOT)})
    return env


def spawn(command: list[str], env: dict, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "ab")
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=die_with_parent)


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 30 s; only this process (its own session)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


class Scraper:
    """Scrapes the exporter every ``interval`` s, as Prometheus would; keeps each scrape's time."""

    def __init__(self, url: str, interval: float):
        self.url, self.interval = url, interval
        self.times: list[tuple[float, float]] = []  # (monotonic when, seconds)
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="scraper", daemon=True)
        self.thread.start()

    def scrape(self) -> float:
        started = time.perf_counter()
        with urllib.request.urlopen(self.url, timeout=120) as response:
            body = response.read()
        if b"stateful_streams_batches_total" not in body:
            raise BenchError(f"the exporter's answer has no stateful_streams_batches_total ({len(body)} bytes)")
        return time.perf_counter() - started

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.times.append((time.monotonic(), self.scrape()))
            except Exception as exc:  # recorded; a run with failed scrapes says so
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            self.stop.wait(self.interval)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=130)


# ---------------------------------------------------------------------------- the console
def measure_console(data_dir: Path, repeats: int, scraper: Scraper) -> dict:
    """Every page (AppTest), one exporter scrape and a DuckDB count per sink, now."""
    from bench.bench_month import count_sinks, time_pages

    load_before = load_average()
    pages = time_pages(data_dir, repeats)
    return {"load_average_before": load_before, "pages": pages, "exporter_scrape_s": round(scraper.scrape(), 3),
            "sinks": count_sinks(data_dir), "load_average_after": load_average()}


# ---------------------------------------------------------------------------- the verdict
def _mb(value_bytes: float) -> float:
    return round(value_bytes / 1e6, 1)


def judge(start: dict, end: dict, samples: list[dict], settings: dict, minutes: float) -> dict:
    """Start against end: what must stay flat, what grows within its retention, the pages.

    ``start``/``end`` are the console measurements, taken with the first and the last sample.
    Flat is judged from the sample a quarter into the run (``from``; the JVM's heap and the
    Python workers fill up in the first minutes) to the last: a process's RSS grows by at most
    MEMORY_GROWTH of it or MEMORY_SLACK_MB; the checkpoint likewise (CHECKPOINT_*); a sink's
    current table files stay under the batches of one compaction interval (each batch adds at
    most a file per sink) plus 10. With NMT samples the JVM is judged by the bound its settings
    allow instead (long_run_samples.judge_jvm). The benchmark's own process is reported, not judged."""
    first, reference, last = samples[0], samples[len(samples) // 4], samples[-1]
    verdict: dict = {"flat": {}, "within_retention": {}, "pages": {}, "flat_from_minute": reference["minute"]}
    mem_first, mem_ref, mem_last = first["memory"], reference["memory"], last["memory"]
    jvm = judge_jvm(samples, MEMORY_GROWTH, MEMORY_SLACK_MB)  # with NMT: the JVM by its configured bound (issue 28)
    parts = job_parts((mem_first, mem_ref, mem_last), jvm_bounded=bool(jvm))
    parts += [(name, mem_first[name]["rss_mb"], mem_ref[name]["rss_mb"], mem_last[name]["rss_mb"]) for name in mem_first
              if name not in ("job", MEASURING)]
    for name, at_start, before, after in parts:
        bound = before + max(MEMORY_GROWTH * before, MEMORY_SLACK_MB)
        verdict["flat"][f"{name} (MB)"] = {"start": at_start, "from": before, "end": after, "bound": round(bound, 1),
                                           "ok": after <= bound}
    verdict["flat"].update(jvm)
    heaps = [(s["minute"], s["jvm_heap"]["live_mb"]) for s in samples[len(samples) // 4:] if s.get("jvm_heap", {}).get("live_mb")]
    if len(heaps) >= 2:  # the live set after a full collection, which the RSS hides (long_run_samples.live_heap)
        before, after = heaps[0][1], heaps[-1][1]
        bound = before + max(MEMORY_GROWTH * before, MEMORY_SLACK_MB)
        verdict["flat"]["job JVM heap live after a full GC (MB)"] = {
            "start": next((s["jvm_heap"]["live_mb"] for s in samples if s.get("jvm_heap", {}).get("live_mb")), None),
            "from": before, "end": after, "bound": round(bound, 1), "ok": after <= bound, "samples": heaps}
    verdict["measuring_process_mb"] = {"start": mem_first[MEASURING]["rss_mb"], "end": mem_last[MEASURING]["rss_mb"]}
    at_start, before, after = (sample["disk"]["checkpoint"]["bytes"] for sample in (first, reference, last))
    bound = before + max(CHECKPOINT_GROWTH * before, CHECKPOINT_SLACK_MB * 1e6)
    verdict["flat"]["checkpoint (MB)"] = {"start": _mb(at_start), "from": _mb(before), "end": _mb(after),
                                          "bound": _mb(bound), "ok": after <= bound}
    batches_per_round = settings["sinks.compact_interval"] / settings["job.trigger_interval"]
    for sink in store.SINKS:
        files = last["disk"][sink]["table_files"]
        bound = int(batches_per_round) + 10
        verdict["flat"][f"{sink} current table files"] = {"start": first["disk"][sink]["table_files"],
                                                          "from": reference["disk"][sink]["table_files"], "end": files,
                                                          "bound": bound, "ok": files <= bound}
    span_min = max(last["minute"] - first["minute"], 1e-9)

    def grown(label: str, before_bytes: int, after_bytes: int, kept: str) -> None:
        per_min = (after_bytes - before_bytes) / span_min
        verdict["within_retention"][label] = {"start_mb": _mb(before_bytes), "end_mb": _mb(after_bytes),
                                              "mb_per_min": round(per_min / 1e6, 2),
                                              "projected_mb_per_day": round(per_min * 1440 / 1e6), "kept": kept}

    for sink in store.SINKS:
        d0, d1 = first["disk"][sink], last["disk"][sink]
        grown(f"{sink} Parquet on disk", d0["parquet_bytes"], d1["parquet_bytes"],
              f"current files, and replaced ones for sinks.vacuum_retention ({settings['sinks.vacuum_retention'] / 3600:g} h)")
        grown(f"{sink} Delta log", d0["log_bytes"], d1["log_bytes"], "an hour of commits (or back to the oldest savepoint)")
    metrics_bytes = [sum(sample["disk"][f"metrics/{stream}"]["bytes"] for stream in store.METRIC_STREAMS)
                     for sample in (first, last)]
    grown("metrics (every stream)", *metrics_bytes,
          f"whole days for metrics.retention ({settings['metrics.retention'] / 86400:g} days), today's and yesterday's always")
    grown("broker data", first["disk"]["broker"]["bytes"], last["disk"]["broker"]["bytes"],
          "forever (the topics' retention is infinite by design: changelogs are replayed from the earliest)")
    for page, timing in end["pages"].items():
        at_start = start["pages"].get(page, {})
        if "error" in timing or "error" in at_start:
            verdict["pages"][page] = {"error": timing.get("error") or at_start.get("error")}
            continue
        slowest = max(timing["cold_s"], timing["warm_max_s"])
        growth = timing["warm_s"] / at_start["warm_s"] if at_start.get("warm_s") else None
        verdict["pages"][page] = {"start_warm_s": at_start["warm_s"], "end_warm_s": timing["warm_s"], "end_slowest_s": slowest,
                                  "under_limit": slowest <= PAGE_LIMIT_S,
                                  "warm_growth": None if growth is None else round(growth, 2),
                                  "within_growth": growth is not None and growth <= PAGE_GROWTH}
    verdict["exporter_scrape_s"] = {"start": start["exporter_scrape_s"], "end": end["exporter_scrape_s"]}
    verdict["flat_ok"] = all(entry["ok"] for entry in verdict["flat"].values())
    verdict["pages_ok"] = all(entry.get("under_limit") and entry.get("within_growth") for entry in verdict["pages"].values())
    verdict["minutes"] = round(minutes, 1)
    return verdict


def table_rows(result: dict) -> list[tuple[str, str, str, str]]:
    """Rows of bench/run.py's table: memory of the job and the slowest page, end against start."""
    verdict = result.get("verdict")
    if not verdict:
        return []
    label = f"long run ({verdict['minutes']:g} min{', PARTIAL' if result.get('partial') else ''}) at " \
            f"{result['workload']['rate']:,} orders/s, trigger {result['workload']['trigger_interval_s']:g} s"
    load = f" (load {result['samples'][-1]['load_average'][0]:.1f})"
    pss = {key: sample["memory"]["job"]["pss_mb"] for key, sample in zip(("start", "from", "end"), (
        result["samples"][0], result["samples"][len(result["samples"]) // 4], result["samples"][-1]))}
    rows = [(f"{label}: job PSS (driver + JVM + workers) at the end", f"{pss['end']:,.0f} MB{load}",
             f"at the start {pss['start']:,.0f} MB, at {verdict['flat_from_minute']:g} min {pss['from']:,.0f} MB",
             f"{pss['end'] / pss['from']:.2f}" if pss["from"] else "–")]
    timed = {page: v for page, v in verdict["pages"].items() if "error" not in v}
    if timed:
        page = max(timed, key=lambda p: timed[p]["end_slowest_s"])
        rows.append((f"{label}: slowest console page at the end (target 1.5 s)", f"{timed[page]['end_slowest_s']:.2f} s ({page}){load}",
                     f"warm at the start {timed[page]['start_warm_s']:.2f} s", "–" if timed[page]["warm_growth"] is None
                     else f"{timed[page]['warm_growth']:.2f}"))
    bad = [name for name, entry in verdict["flat"].items() if not entry["ok"]]
    rows.append((f"{label}: what must stay flat (memory of each process, checkpoint, current sink files)",
                 "flat" if not bad else "GREW: " + ", ".join(bad), f"{len(verdict['flat'])} quantities", "–"))
    return rows


# ---------------------------------------------------------------------------- the run
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=HOUR_MIN, help="how long the orders flow (the hour: 60)")
    parser.add_argument("--rate", type=int, default=2000, help="orders per second")
    parser.add_argument("--trigger", default="0.5s", help="job.trigger_interval")
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--items", type=int, default=2_000)
    parser.add_argument("--orders", type=int, default=200_000, help="orders in the CSV the producer loops over")
    parser.add_argument("--warmup-seconds", type=float, default=60.0, help="orders flowing before the start is measured")
    parser.add_argument("--sample-seconds", type=float, default=30.0)
    parser.add_argument("--live-heap-minutes", type=float, default=5.0,
                        help="the job JVM's live heap (after a full collection) with a sample this often; 0: never")
    parser.add_argument("--nmt", action=argparse.BooleanOptionalAction, default=True, help="run the job's JVM with "
                        f"{NMT_OPTION} (its native memory by category with each heap sample; the verdict's JVM bound)")
    parser.add_argument("--scrape-seconds", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=3, help="warm runs per page (the median is reported)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another setting of the job")
    parser.add_argument("--jvm-env", action="append", default=[], metavar="KEY=VALUE", help="an environment variable of "
                        "the job's driver JVM only, not of its Python processes (an allocator: LD_PRELOAD, MALLOC_CONF)")
    parser.add_argument("--out", type=Path, help="write the JSON here, not bench/results/long_run.json (a look that "
                        "must not replace the hour's figures)")
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.set)
    if args.nmt:  # after any options given with --set
        extra["spark.extra_java_options"] = " ".join(filter(None, (extra.get("spark.extra_java_options"), NMT_OPTION)))
    began_wall = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-long-run-"))
    samples: list[dict] = []
    result: dict = {}
    with ExitStack() as cleanup:  # unwinds in reverse: producer, exporter and job stop before the broker
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        generated = work / "gen"
        subprocess.run([sys.executable, "-m", "pipeline", "datagen", "--out", str(generated), "--users", str(args.users),
                        "--items", str(args.items), "--orders", str(args.orders), "--seed", "28"],
                       cwd=ROOT, check=True, capture_output=True)
        broker = cleanup.enter_context(EmbeddedBroker(work / "broker"))
        topics = bench_topics("long-run")
        settings = load_settings(env={}, cli={
            "pulsar.service_url": broker.service_url, "paths.data_dir": str(work / "data"), "spark.master": "local[2]",
            "job.trigger_interval": args.trigger, **{f"topics.{k}": v for k, v in topics.items()}, **extra})
        env = child_env(settings)
        for kind in ("users", "items"):
            subprocess.run([sys.executable, "-m", "pipeline", "produce", kind, "--file", str(generated / f"{kind}.csv"),
                            "--quiet"], cwd=ROOT, env=env, check=True, capture_output=True)
        log_path = work / "job.log"
        from bench.bench_latency import start_job_with

        with driver_jvm_environment(args.jvm_env, work):  # tests/jobproc.py gives the job this process's environment
            job = start_job_with(settings, log_path, extra)  # --set flags for what tests/jobproc.py does not pass on
        cleanup.callback(job.stop)
        check = alive(job, log_path)
        loaded = args.users + args.items
        wait_until(lambda: sum(r.get("num_input_rows", 0) for r in parse_lines(tail_lines(settings.data_dir, "progress", 10_000)[0]))
                   >= loaded, timeout=600, what="the job to load the users and items", interval=1.0, check=check)
        print(f"the job loaded {loaded:,} users and items", flush=True)
        exporter = spawn([sys.executable, "-m", "app.exporter", "--port", str(find_free_port())], env, work / "exporter.log")
        cleanup.callback(stop_process, exporter)
        url = wait_until(lambda: next((line.split()[1] for line in (work / "exporter.log").read_text().splitlines()
                                       if line.startswith("exporter: http")), None), timeout=120, what="the exporter's URL")
        producer = spawn([sys.executable, "-m", "pipeline", "produce", "orders", "--file", str(generated / "orders.csv"),
                          "--rate", str(args.rate), "--loop", "--quiet"], env, work / "producer.log")
        cleanup.callback(stop_process, producer)
        scraper = Scraper(url, args.scrape_seconds)
        cleanup.callback(scraper.close)
        procs = {"broker": broker.process.pid, "producer": producer.pid, "exporter": exporter.pid, MEASURING: os.getpid()}
        print(f"orders at {args.rate:,}/s; warm-up {args.warmup_seconds:g}s…", flush=True)
        time.sleep(args.warmup_seconds)  # a benchmark's pacing, not a synchronisation
        check()
        began = time.monotonic()
        samples.append(sample(began, procs, job.proc.pid, settings.data_dir, broker.broker_dir,
                              heap=bool(args.live_heap_minutes)))
        next_heap = began + args.live_heap_minutes * 60
        start = measure_console(settings.data_dir, args.repeats, scraper)
        print(f"start: {samples[-1]['memory']['job']} pages "
              f"{ {p: t.get('warm_s') for p, t in start['pages'].items()} } scrape {start['exporter_scrape_s']} s", flush=True)
        deadline = began + args.minutes * 60
        while time.monotonic() < deadline:
            time.sleep(min(args.sample_seconds, max(0.0, deadline - time.monotonic())))
            check()
            if producer.poll() is not None or exporter.poll() is not None:
                raise BenchError(f"the producer ({producer.returncode}) or the exporter ({exporter.poll()}) exited; "
                                 f"see {work}")
            heap_due = args.live_heap_minutes and time.monotonic() >= next_heap
            samples.append(sample(began, procs, job.proc.pid, settings.data_dir, broker.broker_dir, heap=heap_due))
            next_heap += args.live_heap_minutes * 60 if heap_due else 0
            s = samples[-1]
            print(f"  {s['minute']:5.1f} min: job {s['memory']['job']['total_mb']:,.0f} MB (pss {s['memory']['job']['pss_mb']:,.0f}), "
                  f"broker {s['memory']['broker']['rss_mb']:,.0f} MB, exporter {s['memory']['exporter']['rss_mb']:,.0f} MB, "
                  f"disk {s['disk']['total']['bytes'] / 1e6:,.0f} MB, batch {s['batch'].get('batch_id')} "
                  f"({s['batch'].get('batch_duration_ms')} ms), load {s['load_average'][0]:.1f}"
                  + (f", JVM heap live {s['jvm_heap'].get('live_mb')} MB" if "jvm_heap" in s else ""), flush=True)
        last = sample(began, procs, job.proc.pid, settings.data_dir, broker.broker_dir, heap=bool(args.live_heap_minutes))
        samples.append(last)
        end = measure_console(settings.data_dir, args.repeats, scraper)
        scraper.close()
        scrapes = [seconds for _, seconds in scraper.times]
        minutes = (time.monotonic() - began) / 60
        job_settings = {key: settings[key] for key in ("job.trigger_interval", "sinks.compact_interval",
                                                       "sinks.vacuum_retention", "metrics.retention")}
        events = [row["kind"] for row in parse_lines(tail_lines(settings.data_dir, "events", 10_000)[0])]
        window_ms = (time.time() - minutes * 60) * 1000  # the batches of the measured window
        batches = [row for row in read_rows(settings.data_dir, "progress") if row.get("ts_ms", 0) >= window_ms]
        durations = [row.get("batch_duration_ms") or 0 for row in batches]
        result = {
            "date": now_utc(), "machine": machine(), "partial": args.minutes < HOUR_MIN,
            "workload": {"rate": args.rate, "trigger_interval_s": settings["job.trigger_interval"], "minutes": args.minutes,
                         "users": args.users, "items": args.items, "orders_csv": args.orders, "spark_master": "local[2]",
                         "settings": {**job_settings, **extra}, "jvm_env": args.jvm_env},
            "start": start, "end": end,
            "exporter_scrapes": {"count": len(scrapes), "failed": len(scraper.errors), "errors": scraper.errors[:5],
                                 "median_s": round(statistics.median(scrapes), 3) if scrapes else None,
                                 "max_s": round(max(scrapes), 3) if scrapes else None},
            "maintenance_rounds": events.count("sinks_maintained"), "metrics_pruned_rounds": events.count("metrics_pruned"),
            "job_batches": {"count": len(batches), "orders_read": sum(row.get("num_input_rows") or 0 for row in batches),
                            "duration_ms_p50": percentile(durations, 50), "duration_ms_p99": percentile(durations, 99),
                            "orders_backlog_max_sampled": max((s["batch"].get("backlog", {}).get("orders") or 0
                                                               for s in samples), default=None)},
            "samples": samples,
            "verdict": judge(start, end, samples, job_settings, minutes),
            "wall_s": round(time.perf_counter() - began_wall, 1),
        }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    else:
        write_result(NAME, result)
    verdict = result["verdict"]
    print(f"\n{'PARTIAL ' if result['partial'] else ''}long run of {verdict['minutes']:g} min: "
          f"flat {'yes' if verdict['flat_ok'] else 'NO'}, pages {'ok' if verdict['pages_ok'] else 'NOT ok'}")
    for name, entry in verdict["flat"].items():
        print(f"  {name}: {entry['start']} -> {entry['from']} at {verdict['flat_from_minute']} min -> {entry['end']} "
              f"(bound {entry['bound']}){'' if entry['ok'] else '  GREW'}")
    for name, entry in verdict["within_retention"].items():
        print(f"  {name}: {entry['start_mb']} -> {entry['end_mb']} MB, {entry['mb_per_min']} MB/min "
              f"(~{entry['projected_mb_per_day']:,} MB/day; kept {entry['kept']})")
    for page, entry in verdict["pages"].items():
        print(f"  page {page}: {entry}")
    print(f"  exporter scrape: {verdict['exporter_scrape_s']}; scrapes {result['exporter_scrapes']}")
    print(f"  the job's batches in the window: {result['job_batches']}")
    return result


if __name__ == "__main__":
    main()
