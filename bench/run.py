"""``make bench``: every benchmark in one run, merged into ``bench/results/latest.json``.

Each benchmark measures its baseline in the same run (absolute times on a shared 2-core
machine are noisy; the ratios are what we track) and writes its own JSON beside this one.
At the end one table of every figure beside its baseline is printed as Markdown (ready for
the README) and saved as ``bench/results/latest.md``. A benchmark that fails is recorded
with its error, the others still run, and the exit code is 1.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench import (bench_backlog, bench_console, bench_event_time, bench_flink, bench_latency,  # noqa: E402
                   bench_long_run, bench_month, bench_reader_stalls, bench_reader_sweep, bench_recovery, bench_sql, bench_startup, bench_state,
                   bench_throughput)
from bench.common import RESULTS_DIR, machine, now_utc  # noqa: E402

LATEST = RESULTS_DIR / "latest.json"
LATEST_MD = RESULTS_DIR / "latest.md"

# name -> (module, arguments): the scale of every figure, in one place.
BENCHES = {
    "throughput": (bench_throughput, ["--users", "1000000", "--items", "10000", "--orders", "2000000"]),
    "backlog": (bench_backlog, ["--orders", "1000000", "--users", "200000", "--items", "2000"]),
    "latency": (bench_latency, []),
    "recovery": (bench_recovery, []),
    "startup": (bench_startup, []),
    "reader_stalls": (bench_reader_stalls, ["--reads", "120", "--queues", "5000,1000,500"]),
    "reader_sweep": (bench_reader_sweep, ["--readers", "3000"]),
    "state": (bench_state, []),
    "console": (bench_console, ["--orders", "5000000"]),
    "sql": (bench_sql, ["--keys", "1000000"]),
    "event_time": (bench_event_time, ["--users", "1000000", "--items", "10000", "--orders", "2000000",
                                      "--partitions", "1,4"]),
    "flink": (bench_flink, []),
    # issue 28: 100,000 batches through the sink writer; about 8 h on this machine under load (bench/README.md)
    "month": (bench_month, ["--batches", "100000", "--at", "1000,10000,100000"]),
    # issue 28: an hour of the real job at 2,000 orders/s, trigger 0.5 s (memory, disk, pages at the start and the end)
    "long_run": (bench_long_run, ["--minutes", "60"]),
}


def run_one(name: str, module, argv: list[str]) -> dict:
    print(f"\n=== {name} ({' '.join(argv) or 'defaults'}) ===", flush=True)
    started = time.perf_counter()
    try:
        returned = module.main(argv)
        # bench_console returns an exit code and keeps its figures in its JSON
        figures = returned if isinstance(returned, dict) else json.loads((RESULTS_DIR / f"{name}.json").read_text())
    except Exception as exc:  # recorded; the other benchmarks still run
        traceback.print_exc()
        figures = {"error": f"{type(exc).__name__}: {exc}"}
    figures["bench_s"] = round(time.perf_counter() - started, 1)
    return figures


def _f(value, spec: str = ",.2f", unit: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{unit}"


def _load(figures: dict) -> str:
    """`` (load 3.2)``: the 1-minute load average recorded with a figure, if it was."""
    load = figures.get("load_average")
    return f" (load {load[0]:.1f})" if load else ""


def figure_rows(results: dict) -> list[tuple[str, str, str, str]]:
    """(figure, value, baseline measured in the same run, ratio) for the combined table."""
    rows = []
    t = results.get("throughput", {})
    if isinstance(t.get("stateless_spark"), dict) and t.get("python_consumer"):
        rows.append(("throughput, stateless source + parse (rows/s; target >= 100,000 and >= 0.8)",
                     _f(t["stateless_spark"]["orders_per_s"], ",.0f"),
                     f"plain Python consumer {_f(t['python_consumer']['orders_per_s'], ',.0f')}",
                     _f(t["stateless_vs_python"])))
    if isinstance(t.get("job"), dict) and t.get("stateless_spark") and t.get("python_consumer"):
        job = "throughput, job with 1M users in state (orders/s; target >= 40,000)"
        rows.append((job, _f(t["job"]["orders_per_s"], ",.0f"),
                     f"stateless Spark {_f(t['stateless_spark']['orders_per_s'], ',.0f')}", _f(t["job_vs_stateless"])))
        rows.append((job, _f(t["job"]["orders_per_s"], ",.0f"),
                     f"plain Python consumer {_f(t['python_consumer']['orders_per_s'], ',.0f')}", _f(t["job_vs_python"], ".3f")))
    if isinstance(t.get("job_changelogs_interleaved"), dict) and isinstance(t.get("job"), dict):
        rows.append(("throughput, job loading the users as it goes (orders/s)",
                     _f(t["job_changelogs_interleaved"]["orders_per_s"], ",.0f"),
                     f"with the users in state {_f(t['job']['orders_per_s'], ',.0f')}", _f(t["interleaved_vs_job"])))
    backlog = results.get("backlog", {})
    if isinstance(backlog.get("unbatched"), dict) and isinstance(backlog.get("batched"), dict):
        unbatched, batched = backlog["unbatched"], backlog["batched"]
        label = f"backlog of {backlog['workload']['orders']:,} orders, unbatched: orders/s drained (target >= 0.5, aim 0.8)"
        if "error" in unbatched:
            value = (f"did not drain: {unbatched['enriched'] + unbatched['missing']:,} orders decided, then "
                     f"{unbatched['error'][:60]}{_load(unbatched)}")
        else:
            value = (_f(unbatched["orders_per_s"], ",.0f") + _load(unbatched)
                     + ("" if unbatched["exactly_once"] else " (NOT every order exactly once)"))
        rows.append((label, value, f"same backlog batched {_f(batched['orders_per_s'], ',.0f')}{_load(batched)}"
                     + ("" if "error" not in batched else f" (did not drain: {batched['error'][:60]})"),
                     _f(backlog["unbatched_vs_batched"])))
    for r in results.get("latency", {}).get("rates", []):
        label = f"latency at {r['rate']:,}/s, p50 / p99"
        if "skipped" in r:
            rows.append((label, "not measured", r["skipped"], "–"))
            continue
        job, reader = r["job_enriched"], r["consumer"]
        flag = "" if r["kept_up"] else " (fell behind; lower bounds)"
        rows.append((label, f"{_f(job['p50_s'], '.2f')} / {_f(job['p99_s'], '.2f')} s{flag}{_load(r)}",
                     f"plain reader p99 {_f(reader['p99_s'] * 1000 if reader['p99_s'] is not None else None, '.0f')} ms",
                     _f(r["job_p99_vs_consumer_p99"], ",.0f")))
    start = results.get("startup", {})
    if "cold_start_median_s" in start:
        rows.append(("cold start, spawn to first commit (median)", _f(start["cold_start_median_s"], ".1f", " s"),
                     f"bare PySpark session + one job {_f(start['bare_spark_median_s'], '.1f')} s",
                     _f(start["cold_start_vs_bare_spark"])))
        if start.get("cold_start_without_class_archive_median_s"):
            rows.append(("cold start without the class archive", _f(start["cold_start_without_class_archive_median_s"], ".1f", " s"),
                         f"with it {_f(start['cold_start_median_s'], '.1f')} s",
                         _f(start["cold_start_without_class_archive_median_s"] / start["cold_start_median_s"])))
    rec = results.get("recovery", {})
    if "cold_start" in rec:
        cold = f"cold start {_f(rec['cold_start']['to_first_batch_s'], '.1f')} s"
        kill = rec["kill_9"]
        rows.append(("recovery, kill -9 to first batch (target <= 15 s)",
                     _f(kill["to_first_batch_s"], ".1f", " s") + _load(kill), cold, _f(kill["vs_cold_start"])))
        restore = rec["restore"]
        if "error" in restore:
            rows.append(("recovery, savepoint restore to first batch", "not measured", restore["error"][:80], "–"))
        else:
            rows.append(("recovery, savepoint restore to first batch", _f(restore["to_first_batch_s"], ".1f", " s"),
                         cold, _f(restore["vs_cold_start"])))
        rows.append(("recovery, orders lost / duplicated", "0 / 0" if rec["exactly_once"] else "NOT exactly once",
                     f"{rec['workload']['orders']:,} orders", "–"))
    stalls = results.get("reader_stalls", {})
    if "by_receiver_queue" in stalls:
        queues = stalls["by_receiver_queue"]
        base = queues[str(stalls["baseline_queue"])]
        for queue, row in queues.items():
            if queue == str(stalls["baseline_queue"]):
                continue
            rows.append((f"range reader stalls, receiver queue {int(queue):,} (rows/s ratio)",
                         f"{row['stalls']} in {row['reads']} ranges of {stalls['range_rows']:,}",
                         f"queue {stalls['baseline_queue']:,}: {base['stalls']} in {base['reads']}",
                         _f(row["rows_per_s_after_first_median"] / base["rows_per_s_after_first_median"])))
    state = results.get("state", {})
    if "steps" in state:
        idle = state["idle_job"]["memory"]
        first = next((s for s in state["steps"] if "skipped" not in s), None)
        for step in state["steps"]:
            if "skipped" in step:
                rows.append((f"state, {step['users']:,} users", "not measured", step["skipped"], "–"))
                continue
            m = step["memory_enriched"]
            parts = (f" ({m['driver_python_mb']:,.0f}+{m['jvm_mb']:,.0f}+{m['python_workers_mb']:,.0f})"
                     if "jvm_mb" in m else "")
            rows.append((f"state, {step['users']:,} users: job RSS after enriching, peak (target <= 4,000 MB)",
                         f"{m['total_mb']:,.0f} MB, peak {step['memory_peak_mb']:,.0f} MB{parts}",
                         f"idle job {idle['total_mb']:,.0f} MB", _f(step["rss_vs_idle"])))
            rows.append((f"state, {step['users']:,} users: orders/s enriched", _f(step["enrich"]["rows_per_s"], ",.0f")
                         + _load(step["enrich"]), f"at {first['users']:,} users {_f(first['enrich']['rows_per_s'], ',.0f')}",
                         _f(step["orders_per_s_vs_first"])))
            rows.append((f"state, {step['users']:,} users: users/s loaded", _f(step["load"]["rows_per_s"], ",.0f"),
                         f"at {first['users']:,} users {_f(first['load']['rows_per_s'], ',.0f')}",
                         _f(step["users_per_s_vs_first"])))
            if "state_bytes" in step:
                rows.append((f"state, {step['users']:,} users: state on disk", f"{step['state_bytes'] / 1e6:,.0f} MB",
                             f"raw users JSON {step['raw_json_bytes'] / 1e6:,.0f} MB", _f(step["state_vs_raw_json"])))
    console = results.get("console", {})
    if "pages" in console:
        base = console["baseline"]["median_s"]
        for page, timing in console["pages"].items():
            slowest = max(timing["cold_s"], timing["warm_max_s"])
            rows.append((f"console, {page.removesuffix('.py')} cold / warm (5M enriched)",
                         f"{_f(timing['cold_s'], '.2f')} / {_f(timing['warm_s'], '.2f')} s"
                         + ("" if slowest <= console["limit_s"] else f" (over {console['limit_s']} s)"),
                         f"DuckDB count over the sink {base:.2f} s", _f(timing["warm_s"] / base if base else None)))
    sql = results.get("sql", {})
    for name, label in (("count", "SQL count by account"), ("join", "SQL three-way LEFT JOIN"),
                        ("filter", "SQL filter and project")):
        if isinstance(sql.get(name), dict):
            job = sql.get("job", {}).get("orders_per_s")
            rows.append((f"{label}, {sql['keys']:,} keys (rows/s)", _f(sql[name]["rows_per_s"], ",.0f") + _load(sql[name]),
                         f"enrichment job {_f(job, ',.0f')} orders/s", _f(sql.get(f"{name}_vs_job"))))
    if isinstance(sql.get("filter"), dict) and isinstance(sql.get("stateless"), dict):
        rows.append(("SQL filter and project beside the stateless ceiling (rows/s)",
                     _f(sql["filter"]["rows_per_s"], ",.0f") + _load(sql["filter"]),
                     f"job's source and parse alone {_f(sql['stateless']['orders_per_s'], ',.0f')}"
                     + _load(sql["stateless"]), _f(sql.get("filter_vs_stateless"))))
    for name, (module, _) in BENCHES.items():  # benchmarks that build their own rows (bench_flink, bench_event_time)
        if hasattr(module, "table_rows") and isinstance(results.get(name), dict) and "error" not in results[name]:
            rows += module.table_rows(results[name])
    for name, figures in results.items():
        if isinstance(figures, dict) and "error" in figures:
            rows.append((f"{name}", "FAILED", figures["error"][:80], "–"))
    return rows


def markdown(results: dict) -> str:
    m = results["machine"]
    ran = [name for name in BENCHES if isinstance(results.get(name), dict) and not results[name].get("from_earlier_run")]
    verb = "Measured" if ran else "Collected from each benchmark's own run (dates below)"
    lines = [f"{verb} {results['date']} on {m['cpus']} × {m['cpu_model']}, {m['memory_gb']} GB, {m['os']}, "
             f"Python {m['python']} (load average then {m['load_average'][0]:.1f}; each figure carries its own)"
             + (f"; this run took {results['total_s'] / 60:.0f} min." if ran else "."), "",
             "| figure | value | baseline (same run) | ratio |", "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in figure_rows(results)]
    earlier = [f"{name} ({figures.get('date', 'undated')})" for name, figures in results.items()
               if isinstance(figures, dict) and figures.get("from_earlier_run")]
    if earlier:
        lines += ["", "Not run this time, taken from their own results: " + ", ".join(earlier) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true", help="rebuild the Markdown table from latest.json")
    parser.add_argument("--collect", action="store_true",
                        help="run nothing: build latest.json and the table from every benchmark's own JSON")
    parser.add_argument("--only", default="", help=f"comma-separated benchmarks to run ({', '.join(BENCHES)}); "
                        "the others' figures are taken from their own JSON in bench/results/, with its date")
    args = parser.parse_args(argv)
    if args.table:  # rebuild the Markdown table from an earlier latest.json
        results = json.loads(LATEST.read_text())
        LATEST_MD.write_text(markdown(results))
        print(markdown(results))
        return 0
    chosen = [name.strip() for name in args.only.split(",") if name.strip()] or list(BENCHES)
    if args.collect:
        chosen = []
    unknown = sorted(set(chosen) - set(BENCHES))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; expected some of {list(BENCHES)}")
    started = time.perf_counter()
    results: dict = {"date": now_utc(), "machine": machine()}
    for name, (module, arguments) in BENCHES.items():
        if name in chosen:
            results[name] = run_one(name, module, arguments)
        elif (RESULTS_DIR / f"{name}.json").is_file():  # an earlier run's figures, marked as such
            results[name] = {**json.loads((RESULTS_DIR / f"{name}.json").read_text()), "from_earlier_run": True}
    results["total_s"] = round(time.perf_counter() - started, 1)
    LATEST.parent.mkdir(parents=True, exist_ok=True)
    LATEST.write_text(json.dumps(results, indent=2, default=str) + "\n")
    table = markdown(results)
    LATEST_MD.write_text(table)
    print("\n" + table)
    print(f"wrote {LATEST} and {LATEST_MD} in {results['total_s']:.0f}s")
    return 1 if any(isinstance(v, dict) and "error" in v for v in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
