"""Waiting on a condition with a deadline: the only way tests synchronise."""

from __future__ import annotations

import time
from typing import Callable


def wait_for(condition: Callable[[], object], timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    """Poll ``condition`` until it returns a truthy value, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
