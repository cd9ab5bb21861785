"""A batch that cannot be committed to a sink stops the job with the path in one line, and
nothing is lost: once the path is fixed, the next run commits it (issue 13, items 5 and 6)."""

from __future__ import annotations

import pytest
import re

from pipeline import store
from pipeline.metrics import read_events
from factories import item, keyed, order, publish, user
from jobproc import JobProcess, cli_args
from sinkread import invoices
from waiting import wait_for

pytestmark = pytest.mark.e2e  # every test here starts the job

ORDERS = 200


def error_lines(log_path) -> list[str]:
    return [line for line in log_path.read_text(errors="replace").splitlines() if line.startswith("error: ")]


def test_a_sink_failure_stops_the_job_and_a_second_job_is_refused(settings_factory, tmp_path):
    import subprocess
    import sys

    settings = settings_factory(enrichment__max_wait="0s")
    url, topics, data_dir = settings.service_url, settings.topics, settings.data_dir
    publish(url, topics["users"], keyed("users", [user(u) for u in range(1, 11)]))
    publish(url, topics["items"], keyed("items", [item(i) for i in range(1, 6)]))
    publish(url, topics["orders"], keyed("orders", [order(n, n % 10 + 1, n % 5 + 1) for n in range(ORDERS)]))
    # A regular file where the enriched sink's table belongs: no batch can commit to it.
    blocked = store.sink_dir(data_dir, "enriched")
    blocked.parent.mkdir(parents=True)
    blocked.write_text("in the way")

    first_log = tmp_path / "first.log"
    job = JobProcess(settings, first_log)
    wait_for(lambda: job.proc.poll() is not None, timeout=300, what="the job to stop on the sink failure")
    assert job.stop() == 2
    line, = error_lines(first_log)
    assert re.fullmatch(rf"error: cannot write sink 'enriched' batch \d+ under '{re.escape(str(blocked))}': "
                        r"File exists", line), line
    failed = read_events(data_dir, ("job_failed",))
    assert failed and "cannot write sink" in failed[-1]["details"]["error"]

    # Fix the path: the next run commits the batch Spark never committed; nothing lost, nothing doubled.
    blocked.unlink()
    job = JobProcess(settings, tmp_path / "second.log")
    try:
        wait_for(lambda: len(invoices(data_dir, "enriched")) >= ORDERS or job.proc.poll() is not None,
                 timeout=300, what="every order after the fix")
        # While it runs, a second job on the same data dir refuses at once, in one line.
        env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("SS_")}
        second = subprocess.run([sys.executable, "-m", "pipeline", *cli_args(settings), "run"], capture_output=True,
                                text=True, env=env, timeout=120)
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert lines[0].startswith(f"error: a job already runs on data dir {str(data_dir)!r}")
    finally:
        assert job.stop() == 0
    assert sorted(invoices(data_dir, "enriched")) == list(range(ORDERS))
