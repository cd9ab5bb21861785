"""Each Spark process's scratch space under the data dir, and the sweep of what dead ones left there.

Spark's local dirs (the state store's working copy of RocksDB, shuffle files, pyspark's) and the
JVM's temporary files (the native libraries of RocksDB, LZ4 and commons-crypto, extracted at every
start) are removed by shutdown hooks, which a ``kill -9``, the kernel's OOM killer or a lost
machine never run. In ``/tmp`` they stayed for good: one crash of a job holding 1M users left its
state's working copy (about 400 MB) and 14 MB of RocksDB's library, and this machine's ``/tmp``
held 14 GB of them after a day of tests and benchmarks.

So a process that starts Spark gives it ``<data_dir>/scratch/<host>-<pid>/`` (Spark's
``spark.local.dir`` and the driver JVM's ``java.io.tmpdir``), and first removes the scratch of
this host's processes that are no longer alive. The host is in the name because containers
sharing a data dir (docker-compose.yaml) each number their processes from 1: one must never
take another's live pid for a dead one of its own. A cluster's executors keep their workers'
own dirs (``SPARK_LOCAL_DIRS``), which their workers clean.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path

from pipeline import store

log = logging.getLogger(__name__)
# Where scratch goes when the data dir cannot hold it (read-only for a look-up, or a comma in its path).
FALLBACK_ROOT = Path(tempfile.gettempdir()) / "stateful-streams-scratch"


def scratch_root(data_dir: Path) -> Path:
    """``<data_dir>/scratch`` (``store.scratch_dir``); in the system's temporary folder when the
    data dir's path has a comma: ``spark.local.dir`` is a comma-separated list, and Spark would
    split the path (a part of it relative to the working directory)."""
    if "," in str(data_dir):
        return FALLBACK_ROOT
    return store.scratch_dir(data_dir)


def own_name(host: str | None = None, pid: int | None = None) -> str:
    """This process's scratch name: ``<host>-<pid>``."""
    return f"{host or socket.gethostname()}-{pid or os.getpid()}"


def is_alive(pid: int) -> bool:
    """Whether a process with this pid exists here (signal 0 checks without sending)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def dead_entries(names: list[str], host: str, alive=is_alive) -> list[str]:
    """The scratch names of ``host``'s processes that are gone; other hosts' and odd names are left.

    # dead_entries(["a-12", "a-99", "b-12", "notes"], "a", alive=lambda pid: pid == 99) -> ["a-12"]
    """
    gone = []
    for name in names:
        owner, _, pid = name.rpartition("-")
        if owner == host and pid.isdigit() and not alive(int(pid)):
            gone.append(name)
    return gone


def take_scratch(data_dir: Path) -> Path:
    """This process's scratch dir, created empty, after removing what this host's dead processes
    left; called once per process, before its JVM starts (``runtime/spark.py``).

    One already there was left by a dead process with the same pid: a restarted container numbers
    its processes as before, so the job often gets its old pid, and with it the dir of the run
    before. It is emptied first."""
    root = scratch_root(data_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a data dir mounted read-only (a console's look-up of the state)
        log.warning("no scratch under %s (%s): using %s", root, exc.strerror or exc, FALLBACK_ROOT)
        root = FALLBACK_ROOT
        root.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    for name in dead_entries(sorted(os.listdir(root)), host):
        shutil.rmtree(root / name, ignore_errors=True)
        log.info("removed the scratch of a process that is gone: %s", root / name)
    own = root / own_name(host)
    shutil.rmtree(own, ignore_errors=True)
    own.mkdir()
    return own


def release_scratch(own: Path) -> None:
    """Remove this process's scratch once its Spark has stopped (what Spark's hooks left)."""
    shutil.rmtree(own, ignore_errors=True)
