"""`make test`: the whole suite as seven pytest sessions in three lanes that run at the same time.

Most of a services test's time is spent waiting (a job's JVM starting, a trigger, a broker), so on
two cores the suite finishes sooner as sessions side by side than as one:

    lane 1: services   the job, the console, the broker (pulsar-lite and the SparkSession) and the
                       job on a standalone cluster
    lane 2: sql        the SQL pipelines' services tests, then
            crash      the chaos tests (tests/test_crash.py), whose jobs run in processes of their own
    lane 3: apache     against Apache Pulsar's JVM (tests/test_apache_pulsar.py), then fast (no
                       broker, no Spark), then
            order      the job read in a hard order: a backlog, partitions, event time's model, and
                       the SQL foreign-key join's model, then
            demo       `make demo`'s processes (tests/test_demo.py)

The lanes are balanced by measured times (2026-11-27, 2 cores, a clean clone of 962fbc5:
services 1,190 s, sql 833, processes 395, apache 615, fast 187, backlog 177; then 172 s of event
time's model and partitions tests moved from services to order, the 67 s cluster test from
processes to services, and the 98 s demo test to lane 3), so they end near one another and the
longest sets the wall time. A clean clone of 35cd94a (2026-11-27, quiet): services 1,069 s; sql
883 then crash 233; apache 422, fast 210, order 331, demo 106; 1,116 s in all. Of 6113cf1:
services 1,072; sql 930 then crash 234; apache 459, fast 186, order 281, demo 110; 1,164 s, so
the foreign-key model test (51 s) moved from sql to order. Of 16b4f27, after it: services 1,126;
sql 859 then crash 290; apache 450, fast 180, order 370, demo 127; 1,149 s, the lanes within 2 %
of one another, so a shorter `make test` now needs cheaper tests, not another split.

Each session still has one broker and one SparkSession of its own; the marker expressions and the
split of the services tests by file cover every test exactly once. Lane 1 prints as it goes; the
other lanes' output is kept in files and printed, a lane at a time, when they end.

    python -m tests.tiers [extra pytest arguments]

Exits 0 only if every tier passed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAST = "not e2e and not services and not browser and not apache"
SERVICES = f"not apache and not ({FAST})"
SQL_FILES = "tests/test_sql_*.py"  # the SQL pipelines' tests: lane 2 runs their services tests
CRASH_FILES = ("tests/test_crash.py",)  # lane 2, after sql
DEMO_FILES = ("tests/test_demo.py",)  # lane 3, last
ORDER_FILES = ("tests/test_backlog.py", "tests/test_event_time_model.py", "tests/test_event_time_partitions.py",
               "tests/test_sql_fk_model.py")  # lane 3, last (the foreign-key model: lane 2 is the longest)
TIERS = {  # name: pytest arguments
    "services": ["-m", SERVICES, f"--ignore-glob={SQL_FILES}",
                 *(f"--ignore={f}" for f in CRASH_FILES + DEMO_FILES + ORDER_FILES)],
    "sql": ["-m", SERVICES, *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(SQL_FILES)
                                    if str(p.relative_to(ROOT)) not in ORDER_FILES)],
    "fast": ["-m", FAST],
    "apache": ["-m", "apache"],
    "crash": ["-m", SERVICES, *CRASH_FILES],
    "demo": ["-m", SERVICES, *DEMO_FILES],
    "order": ["-m", SERVICES, *ORDER_FILES],
}
LANES = (("services",), ("sql", "crash"), ("apache", "fast", "order", "demo"))


def run_lane(tiers: tuple[str, ...], extra: list[str], codes: dict, out) -> None:
    for tier in tiers:
        if out is not None:
            out.write(f"\n===== the {tier} tier =====\n")
            out.flush()
        started = time.monotonic()
        codes[tier] = subprocess.call([sys.executable, "-m", "pytest", "-q", *TIERS[tier], *extra], cwd=ROOT,
                                      stdout=out, stderr=subprocess.STDOUT if out is not None else None)
        if out is not None:
            out.write(f"({tier}: {time.monotonic() - started:.0f} s)\n")
            out.flush()


def main(extra: list[str]) -> int:
    started, codes = time.monotonic(), {}
    logs = [None] + [tempfile.TemporaryFile(mode="w+") for _ in LANES[1:]]
    lanes = [threading.Thread(target=run_lane, args=(tiers, extra, codes, log), daemon=True)
             for tiers, log in zip(LANES, logs)]
    try:
        for lane in lanes:
            lane.start()
        for lane in lanes:
            lane.join()
        for log in logs[1:]:
            log.seek(0)
            sys.stdout.write(log.read())
    finally:
        for log in logs[1:]:
            log.close()
    # pytest's 5 is "no tests collected": a tier a -k filter emptied is not a failure
    failed = {tier: code for tier, code in codes.items() if code not in (0, 5)}
    print(f"\ntiers: {', '.join(f'{tier} exit {codes.get(tier)}' for tier in TIERS)}; "
          f"{time.monotonic() - started:.0f} s in all", flush=True)
    return 1 if failed or len(codes) < len(TIERS) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
