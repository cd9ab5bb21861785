"""The JVM class-data archive that lets the job's Spark driver start faster.

A cold start spends much of its time in the driver JVM loading and verifying Spark's classes
(about 20,000 of them before the first batch commits). Java's class-data sharing (CDS) maps
them from an archive instead. ``make setup`` builds one archive per checkout by running the
real job for one batch on a throwaway embedded broker with ``-XX:ArchiveClassesAtExit``; the
JVM writes the classes it loaded when it exits. :func:`driver_java_options` then points
every driver JVM at it (bench/bench_startup.py measures the difference).

The training run is pipeline/runtime/class_archive_training.py (it runs the job, which starts Spark with
these options: kept apart so that neither imports the other). The archive is a build output
beside the operators' jar, tied to this JDK and this venv's jars: when either changes the JVM
ignores it and starts the slow way (its warnings are silenced), so it can only make a start
faster, never break one.

    python -m pipeline.runtime.class_archive          # (re)build it; make setup does this
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

ARCHIVE = Path(__file__).resolve().parents[1] / "jvm" / "build" / "spark-classes.jsa"
# Without these the JVM prints a line per class it cannot archive (and, with a stale archive,
# why it ignores it) on every start.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

log = logging.getLogger(__name__)


def one_word(option: str) -> str:
    """``option`` as one word of Spark's ``extraJavaOptions``, which splits at spaces and honours
    double quotes: quoted when it has a space (a path under "My Projects")."""
    return f'"{option}"' if any(c.isspace() for c in option) else option


def driver_java_options(archive: Path = ARCHIVE) -> str:
    """JVM options that use the archive when there is one ("" when there is none)."""
    return f"{one_word(f'-XX:SharedArchiveFile={archive}')} {QUIET}" if archive.is_file() else ""


def build(archive: Path = ARCHIVE, timeout_s: float = 600.0) -> bool:
    """Write the archive by running the job once in a child process; False (and one line on
    stderr) when that failed, since a missing archive only costs start-up time."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".tmp")
    partial.unlink(missing_ok=True)
    archive.unlink(missing_ok=True)  # the training JVM must load every class itself
    result = subprocess.run([sys.executable, "-m", "pipeline.runtime.class_archive_training", str(partial)],
                            capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0 or not partial.is_file():
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"note: no JVM class archive built (training run exited {result.returncode}: {last}); "
              "Spark starts without it", file=sys.stderr)
        partial.unlink(missing_ok=True)
        return False
    os.replace(partial, archive)
    print(f"built {archive.relative_to(Path.cwd()) if archive.is_relative_to(Path.cwd()) else archive}")
    return True


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(0 if build() else 0)  # never fail setup over an optimisation
