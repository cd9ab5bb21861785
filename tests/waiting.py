"""Waiting on a condition with a deadline: the only way tests synchronise."""

from __future__ import annotations

import time
from typing import Callable


SLOWEST_POLL = 0.5  # seconds: the longest gap a wait backs off to between two polls


def wait_for(condition: Callable[[], object], timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    """Poll ``condition`` until it returns a truthy value, or fail after ``timeout`` seconds. The
    gap between polls starts at ``interval`` and grows to ``SLOWEST_POLL``: most conditions read a
    broker or a sink's files, and on two cores a wait polling at 10 Hz for minutes takes CPU from
    what it waits on."""
    value = poll(condition, timeout, interval, slowest=max(interval, SLOWEST_POLL))
    if not value:
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
    return value


def poll(condition: Callable[[], object], timeout: float, interval: float = 0.1, slowest: float | None = None):
    """Poll ``condition`` until it returns a truthy value (returned) or ``timeout`` seconds pass
    (its last value returned): for a moment a test tries to catch, and may miss, every
    ``interval`` (growing by half each time up to ``slowest``, if given)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
        if slowest is not None:
            interval = min(interval * 1.5, slowest)
