"""One job per data dir: an ``flock`` the OS drops when its holder dies (issue 13, item 5)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import control
from pipeline.config import load_settings
from waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
HOLD = ("import sys; from pipeline.config import load_settings; from pipeline.control import acquire_job_lock; "
        "lock = acquire_job_lock(load_settings(env={}, cli={'paths.data_dir': sys.argv[1]}), 'job'); "
        "print('locked', flush=True); sys.stdin.read()")


def run_cli(*args: str, data_dir) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SS_")}
    env["SS_PATHS_DATA_DIR"] = str(data_dir)
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=ROOT)


@pytest.fixture
def holder(tmp_path):
    """Another process holding the job lock of ``tmp_path / 'data'``, as a running job does."""
    data_dir = tmp_path / "data"
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(data_dir)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stdout.readline().strip() == "locked"
    yield data_dir, process
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.mark.e2e
def test_a_second_run_and_a_restore_refuse_while_a_job_holds_the_lock(holder):
    data_dir, process = holder
    settings = load_settings(env={}, cli={"paths.data_dir": str(data_dir)})
    assert control.job_is_running(settings)
    for args in (["run"], ["savepoint", "restore", "any"], ["run", "--max-batches", "1"]):
        out = run_cli(*args, data_dir=data_dir)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 2 and len(lines) == 1, out.stderr
        assert lines[0].startswith(f"error: a job already runs on data dir {str(data_dir)!r} (lock ")
        assert f"held by pid {process.pid} (job)" in lines[0]
    # The refused runs removed nothing the running job relies on: the lock is still held.
    assert control.job_is_running(settings)
    assert not (data_dir / "job.pid").exists()


def test_the_lock_goes_with_its_holder_even_on_kill_9(holder):
    data_dir, process = holder
    settings = load_settings(env={}, cli={"paths.data_dir": str(data_dir)})
    process.send_signal(signal.SIGKILL)
    process.wait()
    wait_for(lambda: not control.job_is_running(settings), timeout=10, what="the lock to be dropped")
    with control.acquire_job_lock(settings, "job") as lock:
        assert control.job_is_running(settings)
        assert lock.path.read_text() == f"pid {os.getpid()} (job)\n"
    assert not control.job_is_running(settings)
