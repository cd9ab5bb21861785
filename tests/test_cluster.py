"""The job on a real Spark standalone cluster: a master and one worker on 127.0.0.1 from the
pyspark wheel (``spark-class``), with Spark RPC authentication on, as docker-compose.yaml runs them.

The job runs as ``python -m pipeline run`` with ``spark.master=spark://127.0.0.1:<port>``, so
Spark ships whatever the job adds (``spark.jars``, our Python on the worker's PYTHONPATH) to the
executors the worker starts. The test only feeds the topics and reads the sinks: it does not
care which stages the job has. Every JVM it starts (master, worker, executors) and their Python
workers run in process groups that the fixture ends, and it checks that none is left.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from test_backlog import assert_decided_with_what_was_published_before, publish_backlog
from jobproc import cli_args
from pipeline.feed.broker import die_with_parent
from pipeline.feed.ports import find_free_port
from sinkread import invoices
from waiting import wait_for

pytestmark = pytest.mark.e2e  # every test here starts the job

ROOT = Path(__file__).resolve().parent.parent
SPARK_CLASS = Path(sys.executable).parent / "spark-class"
SPARK_HOME = os.path.dirname(importlib.util.find_spec("pyspark").origin)  # the wheel is a Spark distribution


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _end_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process group (a daemon JVM and whatever it started), then SIGKILL to leftovers."""
    pgid = process.pid  # start_new_session: the group id is the leader's pid
    for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        try:
            wait_for(lambda: not _group_alive(pgid), timeout=grace, interval=0.2, what=f"process group {pgid} to end")
            break
        except AssertionError:
            continue
    assert not _group_alive(pgid), f"processes of group {pgid} survived SIGKILL"


def _listening_addresses(pgids: set[int]) -> list[str]:
    """``address:port`` of every TCP socket that a process of these groups listens on."""
    pids = {str(pid) for pid in _pids_of(pgids)}
    found = []
    for line in subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, check=True).stdout.splitlines():
        owners = set(re.findall(r"pid=(\d+)", line))
        if owners & pids:
            found.append(line.split()[3])
    return found


def _pids_of(pgids: set[int]) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) in pgids:  # stat field 5: the process group
                pids.append(int(entry.name))
    return pids


def _cmdline_has(proc: Path, needle: bytes) -> bool:
    try:
        return needle in (proc / "cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return False


class StandaloneCluster:
    """A Spark master and one worker on 127.0.0.1, each in its own process group."""

    def __init__(self, work: Path, secret: str):
        self.work, self.secret = work, secret
        self.port, self.ui_port = find_free_port(), find_free_port()
        self.processes: list[subprocess.Popen] = []
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SS_", "SPARK_", "PYSPARK_"))}
        # Spark daemons take the secret from _SPARK_AUTH_SECRET, as compose gives it to them
        base |= {"SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1", "_SPARK_AUTH_SECRET": secret, "SPARK_LOG_DIR": str(work / "logs")}
        # Spark 4 turns the REST submission server (port 6066) on by default; it takes no RPC secret.
        # RPC encrypted and no kill buttons, as in compose (the driver's side: pipeline/runtime/spark.py).
        secure = "-Dspark.authenticate=true -Dspark.network.crypto.enabled=true -Dspark.ui.killEnabled=false"
        self._start("master", base | {"SPARK_MASTER_OPTS": f"{secure} -Dspark.master.rest.enabled=false"},
                    "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
                    "--webui-port", str(self.ui_port))
        # executors run our Python: the same interpreter and code as the driver
        worker_env = base | {"SPARK_WORKER_OPTS": secure, "PYSPARK_PYTHON": sys.executable,
                             "PYTHONPATH": str(ROOT)}
        self._start("worker", worker_env, "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                    "--port", str(find_free_port()), "--webui-port", str(find_free_port()), "--cores", "2", "--memory", "2g",
                    "--work-dir", str(work / "worker"))

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, name: str, env: dict[str, str], *args: str) -> None:
        log = (self.work / f"{name}.log").open("ab")
        self.processes.append(subprocess.Popen([str(SPARK_CLASS), *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, start_new_session=True,
                                               preexec_fn=die_with_parent))

    def state(self) -> dict | None:
        """The master's JSON status, or None while its UI is not up."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
                return json.load(response)
        except OSError:
            for process in self.processes:
                assert process.poll() is None, f"a cluster daemon exited with {process.returncode}; see {self.work}"
            return None

    def stop(self) -> None:
        for process in reversed(self.processes):  # the worker (and its executors) first
            _end_group(process)


@pytest.fixture
def cluster(tmp_path):
    work = tmp_path / "cluster"
    work.mkdir()
    running = StandaloneCluster(work, secret=secrets.token_urlsafe(24))
    try:
        wait_for(lambda: (state := running.state()) and [w for w in state["workers"] if w["state"] == "ALIVE"],
                 timeout=120, interval=0.5, what="the worker to register with the master")
        yield running
    finally:
        running.stop()


def test_the_job_on_a_standalone_cluster_writes_every_order_exactly_once(cluster, settings_factory, tmp_path):
    """An unbatched backlog (pulsar-client's defaults) of items, users, tombstones, then orders:
    changelogs first holds on a cluster too, where read tasks run in the worker's executors."""
    settings = settings_factory(spark__master=cluster.url, enrichment__max_wait="0s", job__max_rows_per_batch=1000)
    url, topics, data_dir = settings.service_url, settings.topics, settings.data_dir
    orders = publish_backlog(url, topics, batching=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SS_", "SPARK_", "PYSPARK_"))}
    # the secret goes by environment, never on the command line; the driver binds loopback
    env |= {"SS_SPARK_AUTH_SECRET": cluster.secret, "SPARK_LOCAL_IP": "127.0.0.1"}
    log_path = tmp_path / "job.log"
    with log_path.open("ab") as log:
        job = subprocess.Popen([sys.executable, "-m", "pipeline", *cli_args(settings), "run"], cwd=ROOT, env=env,
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                               preexec_fn=die_with_parent)
    try:
        def done() -> bool:
            assert job.poll() is None, f"the job exited with {job.returncode}: {log_path.read_text()[-3000:]}"
            return len(invoices(data_dir, "enriched")) + len(invoices(data_dir, "missing_state")) >= len(orders)

        wait_for(done, timeout=420, interval=1.0, what="every order through the job on the cluster")
        [app] = cluster.state()["activeapps"]
        assert app["name"] == "stateful-streams" and app["state"] == "RUNNING"
        # the work ran in the worker's executors, not in a local driver
        executors = list((cluster.work / "worker" / app["id"]).iterdir())
        assert executors, "the worker started no executor"
        pgids = {job.pid} | {process.pid for process in cluster.processes}
        listening = _listening_addresses(pgids)
        assert listening and all(address.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:")) for address in listening), listening
        for daemon in ("master", "worker"):
            assert "SecurityManager: authentication enabled" in (cluster.work / f"{daemon}.log").read_text(), daemon
        # on no command line: not the driver JVM's (pipeline/runtime/spark.py hands it over py4j), not an executor's
        needle = cluster.secret.encode()
        leaks = [pid for pid in Path("/proc").iterdir() if pid.name.isdigit() and _cmdline_has(pid, needle)]
        assert not leaks, f"the Spark secret is on the command line of {leaks}"
    finally:
        _end_group(job)
    enriched, missing = invoices(data_dir, "enriched"), invoices(data_dir, "missing_state")
    assert sorted(enriched + missing) == [o["invoiceId"] for o in orders]  # each order once, in exactly one sink
    assert_decided_with_what_was_published_before(data_dir, orders)
    assert cluster.secret not in log_path.read_text(errors="replace")
