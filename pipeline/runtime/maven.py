"""Jars from Maven Central, copied once by ``mvn`` into a cache folder and reused.

Two users: Apache Pulsar standalone for the apache test tier (pipeline/feed/apache_broker.py) and
the Java Pulsar client of the SQL pipelines' JVM topic sender (pipeline/sql/jvm_sender.py). Each
names a pom whose dependencies are the jars; ``mvn dependency:copy-dependencies`` copies them into
a staging folder, renamed into place with a ``.complete`` stamp once whole, so an interrupted
fetch is redone and a finished one costs nothing. Cached under ``~/.cache/stateful-streams/``, or
``$SS_APACHE_PULSAR_CACHE``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.errors import BrokerError

# Maven Central only: Pulsar's poms name other repositories that are unreachable here
SETTINGS_XML = Path(__file__).resolve().parents[1] / "feed" / "apache_pulsar" / "settings.xml"


def cache_root() -> Path:
    return Path(os.environ.get("SS_APACHE_PULSAR_CACHE") or Path.home() / ".cache" / "stateful-streams")


def stamp(lib: Path) -> Path:
    return lib / ".complete"


def copy_jars(pom: Path, lib: Path, marker: str, what: str, args: tuple[str, ...] = (), quiet: bool = True) -> Path:
    """``lib``, holding the jars of ``pom``'s dependencies: copied by ``mvn`` on the first call
    (``marker`` is the jar that proves the copy worked), then returned at once."""
    if stamp(lib).exists():
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError(f"fetching {what} needs Maven: apt-get install maven")
    staging = lib.with_name(lib.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    command = [mvn, "-B", "-s", str(SETTINGS_XML), "-f", str(pom), *args, "dependency:copy-dependencies",
               f"-DoutputDirectory={staging}", "-DincludeScope=runtime"] + (["-q"] if quiet else [])
    print(f"fetching {what} from Maven Central into {lib.parent}", file=sys.stderr, flush=True)
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0 or not (staging / marker).exists():
        tail = "\n".join(done.stdout.strip().splitlines()[-5:])
        raise BrokerError(f"mvn could not fetch {what} (exit {done.returncode}): {tail}")
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)
    stamp(lib).write_text(marker + "\n")
    return lib
