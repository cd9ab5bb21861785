"""Exactly-once through crashes: a measured chaos run (kill -9 at a random moment, between a batch's
sink and Spark commits, during the sinks' compaction and vacuum (every 2 s), and after a broker
restart, kills during savepoint take and restore, a full disk) that
counts what it survived and checks nothing was lost or doubled (CHAOS_ROUNDS=N for more), with
the console busy on state look-ups all along."""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from pipeline import control, store
from pipeline.feed.broker import EmbeddedBroker
from pipeline.config import load_settings
from pipeline.metrics import read_rows
from pipeline.sinks import SinkWriter, last_committed_batch
from factories import item, keyed, order, publish, user
from forkkill import killed_at_step
from jobproc import JobProcess
from sinkread import invoices
from waiting import poll, wait_for

pytestmark = pytest.mark.e2e  # every test here starts the job



def committed_batches(data_dir) -> int:
    return len(read_rows(data_dir, "progress"))


# ------------------------------------------------------------------------ chaos, measured

FEED = 250  # orders published before each phase, so every phase has batches to run
ARTIFACTS = Path(__file__).resolve().parent / "_artifacts"


def _expected_missing(orders: int) -> set[int]:
    return {n for n in range(orders) if (n % 45) + 1 > 40 or (n % 9) + 1 > 8}


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _sinks_ahead_of_spark(data_dir: Path) -> list[int]:
    """Batches a sink holds that Spark's commit log does not yet: what a crash between a batch's
    sink commits and Spark's commit leaves (the re-run must commit nothing twice)."""
    last = last_committed_batch(store.checkpoint_dir(data_dir))
    return sorted({b for b in SinkWriter(data_dir).committed_batches().values() if b > last})


def _fill(disk: Path) -> Path:
    """Fill a file system to the last byte with a ballast file."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (1 << 20, 4096, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError:
                    break
    finally:
        os.close(fd)
    return ballast


class BusyConsole:
    """Viewers keep the console's state look-up busy through the chaos (issue 27): ``clients``
    threads ask the console's own look-up service (pipeline/control/state_service.py, its limits on) for a
    user and an item, each as fast as the limits let it; answers, refusals and errors are counted."""

    def __init__(self, settings, clients: int = 3, pause_s: float = 1.0):
        import threading

        from pipeline.control.state_service import service_for

        self.settings, self.service, self.pause_s = settings, service_for(settings), pause_s
        self.tally: Counter = Counter()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._ask, args=(f"10.0.0.{n}",), daemon=True) for n in range(clients)]

    def _ask(self, client: str) -> None:
        from pipeline.errors import ControlError

        n = 0
        while not self.stop.wait(self.pause_s):
            n += 1
            try:
                control.inspect_state(self.settings, [("users", n % 40 + 1), ("items", n % 8 + 1)], client=client)
                self.tally["answered"] += 1
            except ControlError as exc:
                self.tally["refused by a limit" if "a minute per viewer" in str(exc) or "busy" in str(exc)
                           else "failed"] += 1

    def __enter__(self) -> "BusyConsole":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=360)
        self.tally["worker starts"] = self.service.starts
        self.service.close()


# Rounds of the random and publish-window kills, and of the cut savepoint takes and restores. One
# round (five job starts) keeps `make test` short; CHAOS_ROUNDS=2 or more for the report.
CHAOS_ROUNDS = max(1, int(os.environ.get("CHAOS_ROUNDS", "1")))


@pytest.mark.timeout(2400)  # several job starts on a shared 2-core machine
def test_chaos_measured(tmp_path, unique_topics):
    rng = random.Random(1313)
    tally: Counter = Counter()
    disk = tmp_path / "disk"
    # A disk we can fill (without root the full-disk phase is skipped), with room for the job's
    # and the look-up worker's Spark scratch (about 50 MB each; 101 MB measured before the fill).
    on_tmpfs = _mount_tmpfs(disk, "256m")
    disk.mkdir(exist_ok=True)
    broker = EmbeddedBroker(tmp_path / "broker").start()
    port = broker.port
    topics = unique_topics()
    settings = load_settings(env={}, cli={
        "pulsar.service_url": broker.service_url, "paths.data_dir": str(disk / "data"), "spark.master": "local[2]",
        "job.trigger_interval": "500ms", "job.restart.delay": "1s", "job.restart.attempts": "10",
        "job.max_rows_per_batch": "100", "enrichment.max_wait": "0s",
        # compaction and vacuum (no retention) every 2 s, so kills also land in them
        "sinks.compact_interval": "2s", "sinks.vacuum_retention": "0s",
        **{f"topics.{name}": topic for name, topic in topics.items()}})
    data_dir = settings.data_dir
    messages = publish(broker.service_url, topics["users"], keyed("users", [user(u) for u in range(1, 41)]))
    messages += publish(broker.service_url, topics["items"], keyed("items", [item(i) for i in range(1, 9)]))
    sent = [0]
    notes: list[str] = []

    def feed(count: int = FEED) -> None:
        first = sent[0]
        publish(broker.service_url, topics["orders"], keyed("orders", [order(n, (n % 45) + 1, (n % 9) + 1)
                                                                      for n in range(first, first + count)]))
        sent[0] += count

    def visible() -> list[int]:
        return invoices(data_dir, "enriched") + invoices(data_dir, "missing_state")

    def assert_no_duplicates(when: str) -> None:
        seen = visible()
        assert len(seen) == len(set(seen)), f"duplicates visible {when}"

    jobs: list[JobProcess] = []
    console = BusyConsole(settings).__enter__()  # the console's state look-ups run through every phase

    def start(name: str) -> JobProcess:
        jobs.append(JobProcess(settings, tmp_path / f"{name}.log"))
        return jobs[-1]

    def wait_batch(job: JobProcess, what: str) -> None:
        seen = committed_batches(data_dir)
        wait_for(lambda: committed_batches(data_dir) > seen or job.proc.poll() is not None, timeout=300, what=what)
        assert job.proc.poll() is None, f"the job exited ({job.proc.returncode}) waiting for {what}"

    def kill(job: JobProcess, what: str) -> None:
        job.kill9()
        tally["job kill -9"] += 1
        assert_no_duplicates(f"after kill -9 {what}")

    try:
        # 1. kill -9 at random moments
        for crash in range(CHAOS_ROUNDS):
            feed()
            job = start(f"random{crash}")
            wait_batch(job, f"a batch before random crash {crash + 1}")
            time.sleep(rng.uniform(0.0, 1.5))  # the random moment of the crash, not a synchronisation
            kill(job, f"at random moment {crash + 1}")

        # 2. kill -9 between a batch's sink commits and Spark's commit (polled for; counted when it landed there)
        for attempt in range(CHAOS_ROUNDS):
            feed(2 * FEED)
            job = start(f"publish{attempt}")
            wait_batch(job, "a batch before the commit-window crash")
            poll(lambda: _sinks_ahead_of_spark(data_dir) or job.proc.poll() is not None, timeout=40, interval=0.001)
            kill(job, "between the sink and Spark commits")
            if _sinks_ahead_of_spark(data_dir):
                tally["kills that landed between the sink and Spark commits"] += 1

        # 3. savepoints taken while the job runs, kill -9 mid-copy at random steps
        feed()
        job = start("savepoints")
        wait_batch(job, "a batch before the savepoints")
        for attempt in range(CHAOS_ROUNDS + 1):
            name = f"cut{attempt}"
            if killed_at_step(lambda: control.take_savepoint(settings, name), rng.randint(1, 30)):
                tally["savepoint take kill -9"] += 1
            listed = {s.name: s for s in control.list_savepoints(settings)}
            if name in listed:  # a listed savepoint is always whole
                assert (listed[name].path / "checkpoint" / "commits" / str(listed[name].batch_id)).exists()
        saved = control.take_savepoint(settings, "chaos")

        # 4. the broker restarts mid-stream
        feed()
        wait_batch(job, "a batch before the broker restart")
        broker.stop()
        wait_for(lambda: any(e["kind"] == "restart" for e in read_rows(data_dir, "events")) or job.proc.poll() is not None,
                 timeout=120, what="the job to notice the broker is gone")
        broker = EmbeddedBroker(tmp_path / "broker", port=port).start()
        tally["broker restarts"] += 1
        feed()
        wait_batch(job, "a batch after the broker came back")
        time.sleep(rng.uniform(0.0, 1.0))
        kill(job, "after the broker restart")

        # 5. restore the savepoint, kill -9 mid-restore at random steps: old or new checkpoint each time
        for attempt in range(CHAOS_ROUNDS + 1):
            before = last_committed_batch(store.checkpoint_dir(data_dir))
            if killed_at_step(lambda: control.restore_savepoint(settings, "chaos"), rng.randint(1, 80)):
                tally["restore kill -9"] += 1
            with control.acquire_job_lock(settings, "chaos-test"):
                control.recover_restore(settings)
            assert last_committed_batch(store.checkpoint_dir(data_dir)) in (before, saved.batch_id)
            assert_no_duplicates(f"after a cut restore {attempt + 1}")
        control.restore_savepoint(settings, "chaos")
        assert last_committed_batch(store.checkpoint_dir(data_dir)) == saved.batch_id

        # 6. the disk fills up in the middle of a batch, then space comes back
        if on_tmpfs:
            feed(2 * FEED)
            job = start("disk-full")
            wait_batch(job, "a batch before the disk fills")
            ballast = _fill(disk)
            tally["disk full"] += 1
            try:
                job.proc.wait(timeout=180)
                errors = [line for line in (tmp_path / "disk-full.log").read_text(errors="replace").splitlines()
                          if line.startswith("error: ")]
                notes.append(f"on a full disk the job exited {job.proc.returncode}: {errors[-1] if errors else 'no error line'}")
                job.stop()
                # one line that says what and where, whichever write hit the full disk first
                assert job.proc.returncode == 2 and len(errors) == 1, errors
                assert "No space left on device" in errors[0] and str(data_dir) in errors[0], errors[0]
            except subprocess.TimeoutExpired:
                notes.append("on a full disk the job kept running for 180 s; killed")
                kill(job, "on a full disk")
            ballast.unlink()
            assert_no_duplicates("after the disk filled up")
        else:
            notes.append("no tmpfs could be mounted: full-disk phase skipped")

        # 7. the last run takes every order home
        feed()
        job = start("final")
        try:
            wait_for(lambda: len(visible()) >= sent[0] or job.proc.poll() is not None, timeout=600,
                     what="every order after the chaos")
        finally:
            assert job.stop() == 0
    finally:
        console.__exit__()
        for job in jobs:
            if job.proc.poll() is None:
                job.kill9()
        broker.stop()
        if on_tmpfs:
            seen_final = (invoices(data_dir, "enriched"), invoices(data_dir, "missing_state"))
            # A killed job's JVM may still be closing its files: detach lazily if it is busy.
            if subprocess.run(["umount", str(disk)], check=False).returncode != 0:
                subprocess.run(["umount", "-l", str(disk)], check=False)
    enriched, missing = seen_final if on_tmpfs else (invoices(data_dir, "enriched"), invoices(data_dir, "missing_state"))
    distinct = set(enriched + missing)
    orders = sent[0]
    report = {"kills": dict(tally), "messages": messages + orders, "orders": orders,
              "losses": orders - len(distinct & set(range(orders))),
              "duplicates": len(enriched) + len(missing) - len(distinct), "notes": notes,
              "state_lookups": dict(console.tally)}
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "chaos.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    assert report["losses"] == 0 and report["duplicates"] == 0, report
    assert sorted(enriched + missing) == list(range(orders))
    assert set(missing) == _expected_missing(orders)
    assert console.tally["answered"] > 0, report  # the console was busy all along, and answered
