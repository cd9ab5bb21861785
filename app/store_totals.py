"""Running totals of the metrics store, for the exporter's counters: batches, rows per sink and
events per kind, kept up to date by parsing only what the job appended since the last scrape.

The first read covers the retained store once (:class:`pipeline.metrics_tail.StreamTail`);
after that a scrape reads the new lines only, so a counter costs the same on day 30 as on
day 1. The totals keep counting past the retention (a day file removed later is already
counted), and start again from the retained store when the exporter restarts, which
Prometheus takes as a counter reset.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from pipeline.metrics_tail import StreamTail

SINK_ROWS = {"enriched": "enriched_rows", "missing_state": "missing_rows", "dead_letter": "dead_letter_rows"}


@dataclass(frozen=True)
class StoreTotals:
    """Counts over every progress and event row read so far."""

    batches: int = 0  # progress rows: a batch run again after a restore counts again
    enriched_rows: int = 0
    missing_rows: int = 0
    dead_letter_rows: int = 0
    events: Counter = field(default_factory=Counter)  # kind -> events


def add_progress(totals: StoreTotals, rows: list[dict]) -> StoreTotals:
    """The totals with these progress rows added (pure)."""
    sums = {column: getattr(totals, column) for column in SINK_ROWS.values()}
    for row in rows:
        for sink, column in SINK_ROWS.items():
            value = (row.get("sink_rows") or {}).get(sink)
            sums[column] += value if isinstance(value, int) else 0
    return replace(totals, batches=totals.batches + len(rows), **sums)


def add_events(totals: StoreTotals, rows: list[dict]) -> StoreTotals:
    """The totals with these event rows added (pure)."""
    return replace(totals, events=totals.events + Counter(str(row.get("kind")) for row in rows))


class RunningTotals:
    """The totals of one data dir's store, brought up to date on each :meth:`read`. Thread-safe:
    scrapes may overlap."""

    def __init__(self, data_dir: Path):
        self._progress = StreamTail(data_dir, "progress")
        self._events = StreamTail(data_dir, "events")
        self._totals = StoreTotals()
        self._lock = threading.Lock()

    def read(self) -> StoreTotals:
        with self._lock:
            self._totals = add_events(add_progress(self._totals, self._progress.read_new()), self._events.read_new())
            return self._totals
