"""Waiting on a condition with a deadline: the only way tests synchronise."""

from __future__ import annotations

import time
from typing import Callable


def wait_for(condition: Callable[[], object], timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    """Poll ``condition`` until it returns a truthy value, or fail after ``timeout`` seconds."""
    value = poll(condition, timeout, interval)
    if not value:
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
    return value


def poll(condition: Callable[[], object], timeout: float, interval: float = 0.1):
    """Poll ``condition`` until it returns a truthy value (returned) or ``timeout`` seconds pass
    (its last value returned): for a moment a test tries to catch, and may miss."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
