"""`make test`: the whole suite as three pytest sessions, the Apache Pulsar tier beside the others.

The `apache` tier (tests/test_apache_pulsar.py, about 5 minutes) spends most of its time waiting
on Apache Pulsar's JVM, so it runs in its own session at the same time as the fast tier (every
test that starts no broker and no Spark, one worker) and then the services tier (pulsar-lite,
the SparkSession, the job and the console). Each session still has one broker and one
SparkSession; the three marker expressions below cover every test exactly once. The apache
tier's output is kept in a file and printed when it ends, so the two never interleave.

    python -m tests.tiers [extra pytest arguments]

Exits 0 only if every tier passed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APACHE = "apache"
FAST = "not e2e and not services and not browser and not apache"
SERVICES = f"not apache and not ({FAST})"


def pytest(marker: str, extra: list[str], **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-m", marker, *extra], cwd=ROOT, **popen)


def main(extra: list[str]) -> int:
    started = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as apache_log:
        apache = pytest(APACHE, extra, stdout=apache_log, stderr=subprocess.STDOUT)
        try:
            codes = {"fast": pytest(FAST, extra).wait()}
            codes["services"] = pytest(SERVICES, extra).wait()
            codes[APACHE] = apache.wait()
        finally:
            if apache.poll() is None:  # interrupted: the apache tier stops with us
                apache.terminate()
                apache.wait(timeout=60)
        apache_log.seek(0)
        print(f"\n===== the {APACHE} tier (ran beside the others) =====", flush=True)
        sys.stdout.write(apache_log.read())
    # pytest's 5 is "no tests collected": a tier a -k filter emptied is not a failure
    failed = {tier: code for tier, code in codes.items() if code not in (0, 5)}
    print(f"\ntiers: {', '.join(f'{tier} exit {code}' for tier, code in codes.items())}; "
          f"{time.monotonic() - started:.0f} s in all", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
