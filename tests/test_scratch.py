"""Each Spark process's scratch under the data dir, and the sweep of dead processes' (pipeline/runtime/scratch.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from pipeline.runtime.scratch import (FALLBACK_ROOT, dead_entries, own_name, release_scratch, scratch_root,
                                      take_scratch)


def gone_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_this_hosts_dead_processes_are_swept():
    names = ["a-12", "a-99", "b-12", "notes", "a-x", "a-b-12"]
    assert dead_entries(names, "a", alive=lambda pid: pid == 99) == ["a-12"]
    # a host name with dashes: the pid is what follows the last one
    assert dead_entries(["web-1-7"], "web-1", alive=lambda pid: False) == ["web-1-7"]


def test_taking_scratch_removes_a_dead_processes_and_keeps_the_living(tmp_path):
    root = scratch_root(tmp_path)
    host = socket.gethostname()
    dead = root / own_name(host, gone_pid())
    (dead / "spark-1" / "StateStoreId(opId=0,partId=0)").mkdir(parents=True)
    (dead / "librocksdbjni1.so").write_bytes(b"x" * 1000)
    living = root / own_name(host, 1)  # pid 1 is always alive
    living.mkdir()
    elsewhere = root / own_name("another-host", gone_pid())  # a container sharing the data dir
    elsewhere.mkdir()
    own = take_scratch(tmp_path)
    assert own == root / own_name() and own.is_dir()
    assert not dead.exists()
    assert living.is_dir() and elsewhere.is_dir()


def test_a_dir_left_by_a_dead_process_with_this_pid_is_emptied(tmp_path):
    """A restarted container gives the job its old pid: the run before left the same name."""
    stale = scratch_root(tmp_path) / own_name()
    stale.mkdir(parents=True)
    (stale / "librocksdbjni1.so").write_bytes(b"x")
    own = take_scratch(tmp_path)
    assert own == stale and list(own.iterdir()) == []


def test_a_data_dir_with_a_comma_keeps_its_scratch_out_of_spark_local_dirs_list(tmp_path):
    plain, comma = scratch_root(tmp_path / "var"), scratch_root(tmp_path / "a, b")
    assert plain == tmp_path / "var" / "scratch"
    assert "," not in str(comma) and comma.is_absolute()


def test_a_data_dir_that_cannot_hold_scratch_falls_back_to_the_temporary_folder(tmp_path):
    (tmp_path / "scratch").write_text("in the way")  # as a read-only mount would refuse it
    own = take_scratch(tmp_path)
    try:
        assert own.is_dir() and own.parent == FALLBACK_ROOT
    finally:
        release_scratch(own)


def test_the_sessions_spark_and_jvm_use_the_data_dirs_scratch(spark, tmp_path):
    from pipeline.config import load_settings
    from pipeline.runtime.spark import build_spark

    local_dir = spark.sparkContext.getConf().get("spark.local.dir")
    tmpdir = spark.sparkContext._jvm.java.lang.System.getProperty("java.io.tmpdir")
    assert local_dir == tmpdir
    assert local_dir.endswith(f"/scratch/{own_name()}") and any(Path(local_dir).iterdir())
    # A later call in the same process (the job run in a test's thread) gets the running session:
    # it takes no scratch of its own, and leaves the one in use as it was.
    again = build_spark(load_settings(env={}, cli={"spark.master": "local[2]", "paths.data_dir": str(tmp_path)}))
    assert again.sparkContext.getConf().get("spark.local.dir") == local_dir and any(Path(local_dir).iterdir())
    assert not scratch_root(tmp_path).exists()
