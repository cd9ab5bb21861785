"""An environment variable for the job's driver JVM only (``bench_long_run --jvm-env``): an allocator experiment.

The helper's measurement of issue 28 ran the JVM with jemalloc (``LD_PRELOAD``) and its heap
profiler (``MALLOC_CONF``) while the job's Python processes kept glibc.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path


def jvm_environment(assignments: list[str], work: Path) -> dict[str, str]:
    """What the job process needs so that ``KEY=VALUE`` (``--jvm-env``) reaches its driver JVM only.

    spark-submit runs ``$JAVA_HOME/bin/java``: a JAVA_HOME whose ``bin/java`` exports the variables
    and runs the real java (which spark-submit's launcher also runs, for a moment). The JVM's
    Python workers would inherit them, so their interpreter (PYSPARK_PYTHON) is a script that
    unsets them first; the job's own Python process never has them. For an allocator experiment,
    e.g. ``--jvm-env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2``."""
    if not assignments:
        return {}
    pairs = dict(item.split("=", 1) for item in assignments)
    real = Path(shutil.which("java") or "java").resolve()
    home = work / "jvm-env"
    (home / "bin").mkdir(parents=True)
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in pairs.items())
    java, python = home / "bin" / "java", home / "python"
    java.write_text(f"#!/bin/sh\n{exports}exec {shlex.quote(str(real))} \"$@\"\n")
    python.write_text(f"#!/bin/sh\nunset {' '.join(pairs)}\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    for script in (java, python):
        script.chmod(0o755)
    return {"JAVA_HOME": str(home), "PYSPARK_PYTHON": str(python)}


@contextmanager
def driver_jvm_environment(assignments: list[str], work: Path):
    """This process's environment with :func:`jvm_environment`'s variables while a job starts, then as before."""
    extra = jvm_environment(assignments, work)
    saved = {key: os.environ.get(key) for key in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
