"""Leftovers and races on one data dir (issue 27, item 6): a killed savepoint take leaves nothing
for good, replay requests get distinct numbers, and a probe never makes a starting job refuse."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

from pipeline import control, store
from pipeline.control import savepoints
from forkkill import killed_at_step
from test_restore import make_settings, write_checkpoint


def test_a_killed_take_leaves_its_copy_only_until_the_next_take_or_job_start(tmp_path):
    settings = make_settings(tmp_path / "data")
    write_checkpoint(store.checkpoint_dir(settings.data_dir), 3, "run")
    root = store.savepoints_dir(settings.data_dir)
    # kill -9 at the rename that would publish the copy: the copy is complete and left behind
    assert killed_at_step(lambda: control.take_savepoint(settings, "first"), 1, ((os, "rename"),))
    assert (root / ".first.tmp" / "savepoint.json").exists()

    assert control.take_savepoint(settings, "second").name == "second"
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == ["second"]

    assert killed_at_step(lambda: control.take_savepoint(settings, "third"), 1, ((os, "rename"),))
    assert (root / ".third.tmp").exists()
    savepoints.recover_restore(settings)  # what the job (and a restore) runs at start
    assert not (root / ".third.tmp").exists()
    assert [s.name for s in control.list_savepoints(settings)] == ["second"]


def test_replay_requests_made_at_once_get_distinct_numbers(tmp_path, monkeypatch):
    """Six processes (the console's sessions, the CLI) ask at the same moment."""
    settings = make_settings(tmp_path / "data")
    real_now = control.now_ms

    def slow_now():  # widens the window between reading the numbers and writing the request
        time.sleep(0.05)
        return real_now()

    monkeypatch.setattr(control, "now_ms", slow_now)
    forked = multiprocessing.get_context("fork")
    start, seqs = forked.Barrier(6), forked.Queue()

    def request(i):
        start.wait()
        seqs.put(control.request_replay(settings, "users" if i % 2 else "items", requested_by=f"p{i}")["seq"])

    children = [forked.Process(target=request, args=(i,)) for i in range(6)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert sorted(seqs.get(timeout=5) for _ in children) == [1, 2, 3, 4, 5, 6]
    files = sorted(p.name for p in store.replay_requests_dir(settings.data_dir).glob("*.json"))
    assert files == [f"{seq:08d}.json" for seq in range(1, 7)]


def test_a_run_starting_while_a_probe_looks_never_refuses(tmp_path):
    settings = make_settings(tmp_path / "data")
    control.acquire_job_lock(settings, "job").release()  # the lock file exists, as after any run
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            control.job_is_running(settings)

    probes = [threading.Thread(target=probe, daemon=True) for _ in range(2)]
    for thread in probes:
        thread.start()
    try:
        for _ in range(300):
            control.acquire_job_lock(settings, "job").release()  # a ControlError here fails the test
    finally:
        stop.set()
        for thread in probes:
            thread.join(timeout=10)
