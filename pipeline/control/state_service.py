"""The console's state look-up worker: one long-lived process, a bounded queue, per-client limits.

A state look-up reads the job's RocksDB state through Spark's state data source, so it needs a
JVM; starting one per click cost the console a Spark session each time (bench/bench_state_lookup.py
has the figures). Instead, :class:`StateLookupService` keeps one ``python -m pipeline state
--serve`` process per data dir (started on the first look-up, stopped after ``idle_s`` without
one, started again when it died) and feeds it one request at a time from a queue::

    request  {"id": 7, "keys": [["users", 42], ["items", 7]]}
    answer   {"id": 7, "found": [{"lookup": "users", "key": 42, "batch_id": 41, …}, …]}
             {"id": 7, "error": "unknown lookup 'stores'; …"}

Limits, so no viewer can keep the worker (and the machine's two cores) to themselves: each
client has at most one look-up waiting or running and at most ``per_minute`` a minute, and at
most ``queue_limit`` wait in all; a look-up over them is refused at once with a ControlError
saying why. A look-up that runs over ``timeout_s`` ends the worker (the next one starts afresh).
"""

from __future__ import annotations

import collections
import json
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

from pipeline.config import Settings
from pipeline.errors import ControlError

QUEUE_LIMIT = 8  # look-ups waiting for the worker, all clients together
PER_MINUTE = 6  # look-ups per client per minute
IDLE_S = 600.0  # a worker with nothing to do for this long is stopped (its JVM holds memory)
TIMEOUT_S = 300.0  # one look-up, worker start included


class StateLookupService:
    """One worker process behind a queue; :meth:`lookup` is called from any thread (a console session)."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
                 queue_limit: int = QUEUE_LIMIT, per_minute: int = PER_MINUTE, idle_s: float = IDLE_S,
                 timeout_s: float = TIMEOUT_S, clock: Callable[[], float] = time.monotonic):
        self.command, self.env, self.cwd = command, env, cwd
        self.queue_limit, self.per_minute, self.idle_s, self.timeout_s = queue_limit, per_minute, idle_s, timeout_s
        self.clock = clock
        self.starts = 0  # worker processes started so far
        self._requests: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._busy: set[str] = set()  # clients with a look-up waiting or running
        self._recent: dict[str, collections.deque] = {}  # client -> times of its last look-ups
        self._waiting = 0
        self._process: subprocess.Popen | None = None
        self._answers: queue.Queue = queue.Queue()
        self._stderr: collections.deque = collections.deque(maxlen=20)
        self._next_id = 0
        threading.Thread(target=self._serve, name="state-lookups", daemon=True).start()

    @property
    def pid(self) -> int | None:
        """The worker's process id while it runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def lookup(self, keys: list[tuple[str, int]], client: str) -> list[dict]:
        """What the job holds for each ``(lookup, key)`` (pipeline.control.state.KeyState as dicts), for
        ``client``; a ControlError when a limit refuses it, it fails or it takes too long."""
        future = self._submit([[str(name), int(key)] for name, key in keys], client)
        try:
            # Its own run is cut at timeout_s by the serving thread; the rest is time in the queue.
            return future.result(timeout=2 * self.timeout_s)
        except FutureTimeout:
            future.cancel()  # still queued: the serving thread skips it
            raise ControlError(f"the state look-up waited over {2 * self.timeout_s:.0f}s; try again") from None
        except CancelledError:
            raise ControlError("the state look-up was cancelled; try again") from None

    def _submit(self, keys: list, client: str) -> Future:
        now = self.clock()
        with self._lock:
            if client in self._busy:
                raise ControlError("your previous state look-up is still waiting or running; wait for its answer")
            recent = self._recent.setdefault(client, collections.deque())
            while recent and now - recent[0] >= 60.0:
                recent.popleft()
            if len(recent) >= self.per_minute:
                raise ControlError(f"at most {self.per_minute} state look-ups a minute per viewer; "
                                   f"try again in {60.0 - (now - recent[0]):.0f} s")
            if self._waiting >= self.queue_limit:
                raise ControlError(f"the state look-up worker is busy ({self._waiting} look-ups waiting); try again shortly")
            recent.append(now)
            self._busy.add(client)
            self._waiting += 1
            for name in [name for name, times in self._recent.items() if not times and name not in self._busy]:
                del self._recent[name]  # forget clients with nothing in the last minute
        future: Future = Future()
        future.add_done_callback(lambda _: self._release(client))
        self._requests.put((keys, future))
        return future

    def _release(self, client: str) -> None:
        with self._lock:
            self._busy.discard(client)
            self._waiting -= 1

    # ------------------------------------------------------------------ the worker's side
    def _serve(self) -> None:
        while True:
            try:
                keys, future = self._requests.get(timeout=self.idle_s)
            except queue.Empty:
                self._stop_worker()
                continue
            if not future.set_running_or_notify_cancel():
                continue  # its client gave up waiting
            try:
                future.set_result(self._ask(keys))
            except ControlError as exc:
                future.set_exception(exc)
            except Exception as exc:  # never let the serving thread die
                future.set_exception(ControlError(f"the state look-up failed: {exc}"))

    def _ask(self, keys: list) -> list[dict]:
        process = self._ensure_worker()
        self._next_id += 1
        request_id = self._next_id
        try:
            process.stdin.write(json.dumps({"id": request_id, "keys": keys}) + "\n")
            process.stdin.flush()
        except OSError:
            raise ControlError(self._died()) from None
        deadline = self.clock() + self.timeout_s
        while True:
            try:
                line = self._answers.get(timeout=max(0.1, deadline - self.clock()))
            except queue.Empty:
                self._stop_worker()
                raise ControlError(f"reading the job's state took over {self.timeout_s:.0f}s; try again") from None
            if line is None:
                raise ControlError(self._died())
            answer = json.loads(line)
            if answer.get("id") != request_id:
                continue  # the answer to a look-up that timed out
            if "error" in answer:
                raise ControlError(answer["error"])
            return answer["found"]

    def _ensure_worker(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        from pipeline.feed.broker import die_with_parent

        self._answers = queue.Queue()
        self._stderr.clear()
        try:
            process = subprocess.Popen(self.command, env=self.env, cwd=self.cwd, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                                       preexec_fn=die_with_parent)
        except OSError as exc:
            raise ControlError(f"cannot start the state look-up worker: {exc.strerror or exc}") from exc
        self.starts += 1
        self._process = process
        answers, stderr = self._answers, self._stderr
        threading.Thread(target=_pump, args=(process.stdout, answers.put, True), daemon=True).start()
        threading.Thread(target=_pump, args=(process.stderr, stderr.append, False), daemon=True).start()
        return process

    def _died(self) -> str:
        process = self._process
        code = process.wait(timeout=10) if process is not None else None
        errors = [line[len("error: "):] for line in self._stderr if line.startswith("error: ")]
        self._process = None
        return errors[-1] if errors else f"the state look-up worker exited (code {code}); try again"

    def _stop_worker(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def close(self) -> None:
        self._stop_worker()


def _pump(stream, put: Callable, answers: bool) -> None:
    """Lines of a worker's pipe to ``put``; for its answers, only the JSON lines, then None at the end."""
    for line in stream:
        line = line.rstrip("\n")
        if not answers:
            put(line)
        elif line.startswith("{"):
            put(line)
    if answers:
        put(None)


_SERVICES: dict[str, StateLookupService] = {}
_SERVICES_LOCK = threading.Lock()


def service_for(settings: Settings) -> StateLookupService:
    """This process's one service for the settings' data dir (``python -m pipeline state --serve``)."""
    from pipeline.console import PROJECT_ROOT, settings_environment

    with _SERVICES_LOCK:
        key = str(settings.data_dir)
        if key not in _SERVICES:
            env = {name: value for name, value in os.environ.items() if not name.startswith("SS_")}
            env.update(settings_environment(settings))
            _SERVICES[key] = StateLookupService([sys.executable, "-m", "pipeline", "state", "--serve"], env=env,
                                                cwd=str(PROJECT_ROOT))
        return _SERVICES[key]
