"""Pacing a long publish: a token-bucket rate limit and a one-line progress bar on stderr.

Both take their clock as an argument, so tests drive them with a fake one.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO


class TokenBucket:
    """At most ``rate`` events per second on average, in bursts of at most ``burst`` events.

    Pure: :meth:`take` is told the time and answers how long to wait before the event. The
    bucket lets a debt build up instead of refusing, so a caller that waits exactly that long
    and then proceeds keeps to the promise: the first ``n`` events span at least
    ``(n - 1) / rate`` seconds (the bucket starts with one token, so a summary's msgs/s stays
    under the rate), and any ``n`` later ones at least ``(n - burst) / rate`` seconds.
    """

    def __init__(self, rate: float, burst: float | None = None, now: float = 0.0):
        if not rate > 0:
            raise ValueError(f"rate must be > 0 messages per second, got {rate!r}")
        self.rate = float(rate)
        # a tenth of a second of messages: smooth enough for a demo, big enough to batch
        self.burst = float(burst) if burst is not None else max(1.0, self.rate / 10)
        self.tokens = 1.0
        self.updated = now

    def take(self, now: float) -> float:
        """Spend one token at time ``now``; the seconds to wait before using it (0 if none)."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.updated) * self.rate)
        self.updated = max(self.updated, now)
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class ProgressBar:
    """``label [#####.....] 1200/2400  50%  812 msg/s`` on one line of ``stream``.

    On a terminal the line is redrawn in place at most every ``interval`` seconds; elsewhere
    (docker logs, CI) a new line is written every ``log_interval`` seconds instead.
    """

    WIDTH = 30

    def __init__(self, label: str, total: int | None = None, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, interval: float = 0.2, log_interval: float = 5.0):
        self.label, self.total, self.clock = label, total, clock
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval if self.tty else log_interval
        self.started = clock()
        self.drawn_at = float("-inf") if self.tty else self.started  # a log gets its first line later
        self.count = 0

    def render(self, count: int, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = f"{count / elapsed:,.0f} msg/s"
        if not self.total:
            return f"{self.label} {count:,} sent  {rate}"
        done = min(1.0, count / self.total)
        filled = int(done * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        return f"{self.label} [{bar}] {count:,}/{self.total:,} {done:4.0%}  {rate}"

    def update(self, count: int) -> None:
        self.count = count
        now = self.clock()
        if now - self.drawn_at >= self.interval:
            self._draw(now)

    def message(self, text: str) -> None:
        """Print a line of its own (a bad-row report) without tearing the bar."""
        self.stream.write(("\r\x1b[K" if self.tty else "") + text + "\n")
        self.drawn_at = float("-inf")  # redraw the bar under it on the next update

    def close(self) -> None:
        self._draw(self.clock())
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()

    def _draw(self, now: float) -> None:
        self.drawn_at = now
        line = self.render(self.count, now)
        self.stream.write(f"\r\x1b[K{line}" if self.tty else line + "\n")
        self.stream.flush()
