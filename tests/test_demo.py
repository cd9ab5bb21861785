"""``make demo`` stops cleanly on Ctrl-C: one line per process, no stack trace, and a last line
saying what stopped and why. The real demo runs (its own broker, producers, job and console)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from pipeline.feed.ports import find_free_port
from pipeline.metrics import read_rows
from waiting import wait_for

pytestmark = pytest.mark.e2e
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ctrl_c_stops_every_process_with_one_line_each(tmp_path):
    data_dir = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SS_")}
    env.update(SS_PATHS_DATA_DIR=str(data_dir), SS_APP_PORT=str(find_free_port()), SS_SPARK_MASTER="local[2]")
    # as from a terminal: a shell running the tests in the background (`make test &`) ignores
    # SIGINT, and a child would inherit that and never see the Ctrl-C below
    demo = subprocess.Popen([sys.executable, "-m", "pipeline", "demo"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # the orders start once the job has committed its first batch (the changelogs)
        wait_for(lambda: demo.poll() is not None or any(
                     t["topic"] == "orders" and t["rows"] for p in read_rows(data_dir, "progress") for t in p["topics"]),
                 timeout=300, what="the demo job's first batch of orders")
        assert demo.poll() is None, demo.stdout.read()
        os.killpg(demo.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends to the foreground group
        output, _ = demo.communicate(timeout=180)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    lines = [line for line in output.splitlines() if line.strip()]
    started = [line.split()[1] for line in lines if line.startswith("started ")]
    assert {"broker", "job", "app", "produce-orders"} <= set(started)
    stop_lines = lines[lines.index("stopping the demo (Ctrl-C)…") + 1:]
    assert stop_lines[-1] == f"demo stopped: Ctrl-C; all {len(started)} processes it started have exited"
    stopped = {line.split(":")[0] for line in stop_lines[:-1]}
    assert {"broker", "job", "app", "produce-orders"} <= stopped
    assert all(": stopped (" in line or ": had already exited" in line for line in stop_lines[:-1])
    assert "job: stopped (exit 0)" in "\n".join(stop_lines)
    assert not any(marker in output for marker in ("Traceback", "\tat ", "Exception"))
