"""``make demo``: broker, producers, job, SQL pipelines and console on one machine, stopped together by Ctrl-C.

Each part is its own ``python -m pipeline …`` process, so the demo shows exactly what an
operator would run by hand. Children get a parent-death signal: none outlives the demo. They
run in process groups of their own, so a Ctrl-C in the terminal reaches the demo alone, which
then stops them with SIGTERM, all at once but the broker, which goes last, and prints one line
per process and a last line saying what stopped and why.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.feed.broker import die_with_parent, running_embedded_url
from pipeline.config import Settings
from pipeline.enrich.lookups import CHANGELOGS
from pipeline.errors import BrokerError

DATA = Path(__file__).resolve().parent.parent / "data"
# The seed's SQL examples (data/sql/), each table on a topic of its own beside the job's.
SQL_FILES = ("user_count_by_account.sql", "user_favorite_color_and_cheese.sql")
SQL_TABLES = ("users", "user_favorite_color", "user_favorite_cheese", "user_count_by_account",
              "user_favorite_color_and_cheese")


def sql_args() -> list[str]:
    """``python -m pipeline sql`` arguments of the demo: both examples, their samples, their own topics."""
    topics = [f"--topic={table}=persistent://public/default/sql-{table}" for table in SQL_TABLES]
    return ["sql", *(str(DATA / "sql" / name) for name in SQL_FILES), "--samples", *topics]


class Processes:
    """The demo's children, started in order and stopped in reverse."""

    def __init__(self, settings: Settings):
        self.env = {**os.environ, "SS_PATHS_DATA_DIR": str(settings.data_dir)}
        self.logs = settings.data_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.children: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, *args: str, quiet: bool = True) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab") if quiet else None
        child = subprocess.Popen([sys.executable, "-m", "pipeline", *args], env=self.env, stdout=log, stderr=log,
                                 stdin=subprocess.DEVNULL, preexec_fn=die_with_parent, start_new_session=True)
        self.children.append((name, child))
        print(f"started {name} (pid {child.pid}); log: {self.logs / (name + '.log') if quiet else 'this terminal'}")
        return child

    def stop_all(self, grace_s: float = 60.0) -> None:
        """SIGTERM every running child at once but the broker, wait for each, then the broker (the
        others use it while they stop); one line per child. Together, so a stop takes the longest
        child's time, not the sum of them all (a job finishing its batch, a pipeline, the console)."""
        running = []
        for name, child in reversed(self.children):
            if child.poll() is not None:
                if name.startswith("produce-") and name != "produce-orders" and child.returncode == 0:
                    continue  # a one-off load that finished long ago
                print(f"{name}: had already exited with code {child.returncode}")
                continue
            running.append((name, child))
        for wave in ([(n, c) for n, c in running if n != "broker"], [(n, c) for n, c in running if n == "broker"]):
            started = time.monotonic()
            for _, child in wave:
                child.send_signal(signal.SIGTERM)
            for name, child in wave:
                try:
                    code = child.wait(timeout=max(0.0, started + grace_s - time.monotonic()))
                    how = "on SIGTERM" if code == -signal.SIGTERM else f"exit {code}"
                    print(f"{name}: stopped ({how}) in {time.monotonic() - started:.1f}s")
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
                    print(f"{name}: killed after {grace_s:.0f}s without stopping")

    def first_failure(self, watched: tuple[str, ...]) -> str | None:
        """Why a watched child ended, if one did: ``job exited with code 2``."""
        for name, child in self.children:
            if name in watched and child.poll() is not None:
                return f"{name} exited with code {child.returncode}; see {self.logs / (name + '.log')}"
        return None


def wait_for_first_batch(procs: Processes, settings: Settings, watched: tuple[str, ...]) -> str | None:
    """Wait until the job has committed a batch; why a watched process ended instead, if one did."""
    from pipeline.metrics import read_rows

    while not read_rows(settings.data_dir, "progress"):
        if (failure := procs.first_failure(watched)) is not None:
            return failure
        time.sleep(0.5)
    return None


def run_demo(settings: Settings) -> None:
    procs = Processes(settings)
    why = "every process ended"
    watched = ("job", "app", "broker")
    try:
        if settings.is_embedded and not running_embedded_url(settings.data_dir):
            procs.start("broker", "broker")
            deadline = time.monotonic() + 30
            while not running_embedded_url(settings.data_dir):
                if time.monotonic() > deadline:
                    raise BrokerError(f"the demo broker did not start; see {procs.logs / 'broker.log'}")
                time.sleep(0.2)
        for topic in reversed(CHANGELOGS):  # every changelog (items, users) before the orders
            procs.start(f"produce-{topic}", "produce", topic, "--file", str(DATA / f"{topic}.csv"), "--quiet").wait()
        procs.start("sql", *sql_args())
        procs.start("job", "run")
        procs.start("app", "app")
        # Orders start once the job has committed its first batch (the changelogs): orders sent
        # while Spark starts would wait out its start-up, and the first minute of the console
        # would show that wait as the job's latency.
        print(f"console: http://{settings['app.address']}:{settings['app.port']}  (Ctrl-C stops everything)")
        failure = wait_for_first_batch(procs, settings, watched)
        if failure is None:
            procs.start("produce-orders", "produce", "orders", "--file", str(DATA / "orders.csv"), "--rate", "300",
                        "--loop", "--quiet")
            # orders for these users are already flowing: they wait in the buffer, a few seconds (the
            # console's latency p99 counts that wait)
            time.sleep(3)
            procs.start("produce-users-late", "produce", "users", "--file", str(DATA / "users_late.csv"), "--quiet")
        while failure is None and (failure := procs.first_failure(watched)) is None:
            time.sleep(1)
        why = failure
    except KeyboardInterrupt:
        why = "Ctrl-C"
        print("stopping the demo (Ctrl-C)…")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean stop short
        procs.stop_all()
        print(f"demo stopped: {why}; all {len(procs.children)} processes it started have exited",
              file=sys.stderr if why != "Ctrl-C" else sys.stdout)
