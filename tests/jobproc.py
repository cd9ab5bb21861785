"""The job as a real ``python -m pipeline run`` process, for crash tests (kill -9 of its whole group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from pipeline.feed.broker import die_with_parent
from pipeline.config import KEYS, SECRET_KEYS
from pipeline.job import run_forever


def secret_environment(settings) -> dict[str, str]:
    """The settings' secrets as their ``SS_*`` variables: a child gets them by environment, never
    on its command line (``--set`` refuses them)."""
    return {key.env: settings[key.name] for key in KEYS if key.name in SECRET_KEYS and settings[key.name]}


def cli_args(settings) -> list[str]:
    """--set flags that reproduce these settings (but the secrets) in a child process."""
    keys = ("pulsar.service_url", "paths.data_dir", "spark.master", "job.trigger_interval", "job.max_rows_per_batch",
            "job.restart.attempts", "job.restart.delay", "enrichment.max_wait", "enrichment.time",
            "enrichment.order_time", "enrichment.out_of_orderness", "enrichment.allowed_lateness",
            "enrichment.idle_timeout", "sinks.compact_interval", "sinks.vacuum_retention",
            "topics.users", "topics.items", "topics.orders")
    args = []
    for key in keys:
        value = settings[key]
        if isinstance(value, float):
            value = f"{value}s"
        args += ["--set", f"{key}={value}"]
    return args


class JobProcess:
    def __init__(self, settings, log_path):
        self.log = open(log_path, "ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SS_")} | secret_environment(settings)
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline", *cli_args(settings), "run"],
                                     stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True, preexec_fn=die_with_parent)

    def kill9(self) -> None:
        """A crash: SIGKILL to the job and its JVM and Python workers at once."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.log.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill9()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # leftover Python workers, if any
        except ProcessLookupError:
            pass
        self.log.close()
        return self.proc.returncode


class JobThread:
    """The job in a background thread of the test process, stopped through its event."""

    def __init__(self, settings):
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(settings,), daemon=True)
        self.thread.start()

    def _run(self, settings):
        try:
            run_forever(settings, stop=self.stop)
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def close(self):
        self.stop.set()
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "job did not stop"
        if self.error:
            raise self.error
