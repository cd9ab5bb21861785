"""The token bucket and the progress bar, driven by a fake clock."""

from __future__ import annotations

import io
import random

import pytest

from pipeline.feed.pacing import ProgressBar, TokenBucket


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


def paced_times(bucket: TokenBucket, clock: FakeClock, count: int, gaps=lambda: 0.0) -> list[float]:
    """When each of ``count`` events happens if the caller waits as told."""
    times = []
    for _ in range(count):
        clock.sleep(gaps())
        clock.sleep(bucket.take(clock()))
        times.append(clock())
    return times


def test_events_as_fast_as_possible_are_spread_at_the_rate():
    clock = FakeClock()
    times = paced_times(TokenBucket(rate=50, now=clock()), clock, 101)
    assert times[0] == 100.0  # the first event never waits
    assert times[-1] - times[0] == pytest.approx(100 / 50)
    assert all(b - a == pytest.approx(1 / 50) for a, b in zip(times, times[1:]))


def test_after_an_idle_spell_a_burst_goes_at_once_and_no_more():
    clock = FakeClock()
    bucket = TokenBucket(rate=100, burst=10, now=clock())
    clock.sleep(5)  # idle: the bucket refills, but only up to the burst
    times = paced_times(bucket, clock, 30)
    assert times[:10] == [105.0] * 10
    assert times[10] > 105.0
    assert times[-1] - times[0] == pytest.approx(20 / 100)


def test_no_window_ever_holds_more_than_burst_plus_rate_times_its_length():
    rng = random.Random(4)
    clock = FakeClock()
    rate, burst = 200.0, 20.0
    times = paced_times(TokenBucket(rate, burst, now=clock()), clock, 2000, gaps=lambda: rng.choice([0, 0, 0, 0.002, 0.3]))
    for i in range(0, len(times), 7):
        for j in range(i, len(times), 13):
            assert j - i + 1 <= burst + rate * (times[j] - times[i]) + 1e-6


def test_default_burst_is_a_tenth_of_a_second_and_the_rate_must_be_positive():
    assert TokenBucket(rate=500).burst == 50
    assert TokenBucket(rate=3).burst == 1
    with pytest.raises(ValueError, match="rate must be > 0"):
        TokenBucket(rate=0)


def test_progress_bar_draws_count_total_percent_and_rate():
    clock = FakeClock(0.0)
    bar = ProgressBar("orders.csv -> orders", total=400, stream=io.StringIO(), clock=clock)
    assert bar.render(100, 2.0) == "orders.csv -> orders [#######.......................] 100/400  25%  50 msg/s"
    unbounded = ProgressBar("loop", stream=io.StringIO(), clock=clock)
    assert unbounded.render(1500, 3.0) == "loop 1,500 sent  500 msg/s"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_redraws_in_place_and_reports_stay_whole():
    clock, stream = FakeClock(0.0), Tty()
    bar = ProgressBar("x", total=10, stream=stream, clock=clock)
    bar.update(1)
    bar.update(2)  # too soon to redraw
    clock.sleep(1)
    bar.message("x.csv line 3: field 'id' must be an integer, got 'a'")
    bar.update(3)
    bar.close()
    out = stream.getvalue()
    assert out.count("\r\x1b[K") == 4  # three draws and one cleared line for the report
    assert "\r\x1b[Kx.csv line 3: field 'id' must be an integer, got 'a'\n" in out
    assert out.endswith("3/10  30%  3 msg/s\n")


def test_in_a_log_the_bar_writes_whole_lines_now_and_then():
    clock, stream = FakeClock(0.0), io.StringIO()
    bar = ProgressBar("x", total=100, stream=stream, clock=clock, log_interval=5)
    for count in range(1, 101):
        clock.sleep(0.125)  # exact in binary, so 40 steps are exactly 5 s
        bar.update(count)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert len(lines) == 3  # at 5 s, at 10 s, and the closing line
    assert lines[-1].startswith("x [##############################] 100/100 100%")
