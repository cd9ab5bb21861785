"""``make bench``: every benchmark in one run, merged into ``bench/results/latest.json``.

Each benchmark measures its baseline in the same run (absolute times on a shared 2-core
machine are noisy; the ratios are what we track) and writes its own JSON beside this one.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench import bench_console, bench_throughput  # noqa: E402

LATEST = ROOT / "bench" / "results" / "latest.json"


def main() -> None:
    started = time.perf_counter()
    results = {"throughput": bench_throughput.main([])}
    console = bench_console.main(["--orders", "5000000"]) if hasattr(bench_console, "main") else None
    results["console"] = console if isinstance(console, dict) else json.loads(bench_console.RESULTS.read_text())
    results["total_s"] = round(time.perf_counter() - started, 1)
    LATEST.parent.mkdir(parents=True, exist_ok=True)
    LATEST.write_text(json.dumps(results, indent=2, default=str))
    print(f"wrote {LATEST} in {results['total_s']:.0f}s")


if __name__ == "__main__":
    main()
