"""The console's state look-up (issue 27, item 3): one long-lived worker behind a queue with
per-client limits, not a process per click. Pure: a stand-in worker speaks the protocol."""

from __future__ import annotations

import re
import sys
import threading
import time

import pytest

from waiting import wait_for

from pipeline.errors import ControlError
from pipeline.control.state_service import StateLookupService

# Answers each request with its keys and the worker's pid; "slow" keys take a while, "boom" fails.
WORKER = r"""
import json, os, sys, time
for line in sys.stdin:
    request = json.loads(line)
    names = [name for name, _ in request["keys"]]
    if "slow" in names:
        time.sleep(float(os.environ.get("SLOW_S", "1.5")))
    if "boom" in names:
        print(json.dumps({"id": request["id"], "error": "unknown lookup 'boom'"}), flush=True)
        continue
    print("some noise from the JVM", flush=True)
    found = [{"lookup": name, "key": key, "pid": os.getpid()} for name, key in request["keys"]]
    print(json.dumps({"id": request["id"], "found": found}), flush=True)
"""


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def service_factory():
    made = []

    def make(**kwargs) -> StateLookupService:
        service = StateLookupService([sys.executable, "-c", WORKER], **kwargs)
        made.append(service)
        return service

    yield make
    for service in made:
        service.close()


def test_many_lookups_are_served_by_one_worker_process(service_factory):
    service = service_factory()
    pids = {found["pid"] for client in ("a", "b", "c") for found in service.lookup([("users", 1), ("items", 2)], client)}
    assert len(pids) == 1 and service.starts == 1 and service.pid in pids
    assert service.lookup([("users", 42)], "a")[0] == {"lookup": "users", "key": 42, "pid": service.pid}


def test_a_client_has_one_lookup_at_a_time_and_a_few_a_minute(service_factory):
    clock = Clock()
    service = service_factory(per_minute=3, clock=clock)
    slow = threading.Thread(target=service.lookup, args=([("slow", 1)], "10.0.0.5"))
    slow.start()
    wait_for(lambda: "10.0.0.5" in service._busy, timeout=30, what="the slow look-up to be taken")
    with pytest.raises(ControlError, match=re.escape("your previous state look-up is still waiting or running")):
        service.lookup([("users", 1)], "10.0.0.5")
    assert service.lookup([("users", 1)], "10.0.0.6")  # another client is not held up by the limit
    slow.join()
    service.lookup([("users", 1)], "10.0.0.5")
    service.lookup([("users", 2)], "10.0.0.5")
    with pytest.raises(ControlError, match=re.escape("at most 3 state look-ups a minute per viewer; try again in 60 s")):
        service.lookup([("users", 1)], "10.0.0.5")
    clock.now += 60
    assert service.lookup([("users", 1)], "10.0.0.5")


def test_the_queue_is_bounded(service_factory):
    service = service_factory(queue_limit=2)
    threads = [threading.Thread(target=service.lookup, args=([("slow", 1)], f"client-{n}")) for n in range(2)]
    for thread in threads:
        thread.start()
    wait_for(lambda: service._waiting == 2, timeout=30, what="both look-ups to be taken")
    with pytest.raises(ControlError, match=re.escape("the state look-up worker is busy (2 look-ups waiting)")):
        service.lookup([("users", 1)], "client-9")
    for thread in threads:
        thread.join()
    assert service.lookup([("users", 1)], "client-9")


def test_an_error_is_one_line_and_the_worker_keeps_serving(service_factory):
    service = service_factory()
    with pytest.raises(ControlError, match=re.escape("unknown lookup 'boom'")):
        service.lookup([("boom", 1)], "a")
    assert service.lookup([("users", 1)], "a") and service.starts == 1


def test_a_slow_lookup_ends_the_worker_and_the_next_starts_one(service_factory, monkeypatch):
    monkeypatch.setenv("SLOW_S", "30")
    service = service_factory(timeout_s=1.0)
    with pytest.raises(ControlError, match=re.escape("took over 1s; try again")):
        service.lookup([("slow", 1)], "a")
    assert service.lookup([("users", 1)], "a") and service.starts == 2


def test_an_idle_worker_is_stopped_and_started_again_when_needed(service_factory):
    service = service_factory(idle_s=0.5)
    first = service.lookup([("users", 1)], "a")[0]["pid"]
    wait_for(lambda: service.pid is None, timeout=10, what="the idle worker to stop")
    assert service.lookup([("users", 1)], "a")[0]["pid"] != first and service.starts == 2


def test_a_worker_that_cannot_start_says_why(service_factory):
    service = StateLookupService([sys.executable, "-c", "import sys; print('error: no java here', file=sys.stderr); sys.exit(2)"])
    try:
        with pytest.raises(ControlError, match=re.escape("no java here")):
            service.lookup([("users", 1)], "a")
    finally:
        service.close()
