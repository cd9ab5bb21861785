"""``make demo``: broker, producers, job and console on one machine, stopped together by Ctrl-C.

Each part is its own ``python -m pipeline …`` process, so the demo shows exactly what an
operator would run by hand. Children get a parent-death signal: none outlives the demo.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.broker import die_with_parent, running_embedded_url
from pipeline.config import Settings
from pipeline.errors import BrokerError

DATA = Path(__file__).resolve().parent.parent / "data"


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
                                 stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
        self.children.append((name, child))
        print(f"started {name} (pid {child.pid}); log: {self.logs / (name + '.log') if quiet else 'this terminal'}")
        return child

    def stop_all(self) -> None:
        for name, child in reversed(self.children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for name, child in reversed(self.children):
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()


def run_demo(settings: Settings) -> None:
    procs = Processes(settings)
    try:
        if settings.is_embedded and not running_embedded_url(settings.data_dir):
            procs.start("broker", "broker")
            deadline = time.monotonic() + 30
            while not running_embedded_url(settings.data_dir):
                if time.monotonic() > deadline:
                    raise BrokerError(f"the demo broker did not start; see {procs.logs / 'broker.log'}")
                time.sleep(0.2)
        for topic in ("items", "users"):
            procs.start(f"produce-{topic}", "produce", topic, "--file", str(DATA / f"{topic}.csv"), "--quiet").wait()
        procs.start("job", "run")
        procs.start("produce-orders", "produce", "orders", "--file", str(DATA / "orders.csv"), "--rate", "300",
                    "--loop", "--quiet")
        procs.start("app", "app")
        print(f"console: http://{settings['app.address']}:{settings['app.port']}  (Ctrl-C stops everything)")
        time.sleep(8)  # orders for these users are already flowing: they wait in the buffer
        procs.start("produce-users-late", "produce", "users", "--file", str(DATA / "users_late.csv"), "--quiet")
        while all(child.poll() is None for name, child in procs.children if name in ("job", "app", "broker")):
            time.sleep(1)
        failed = [name for name, child in procs.children if child.poll() not in (None, 0)]
        if failed:
            print(f"stopped: {', '.join(failed)} exited; see {procs.logs}", file=sys.stderr)
    except KeyboardInterrupt:
        print("stopping the demo…")
    finally:
        procs.stop_all()
