"""Metrics retention (issue 28, item 2): the running job removes metrics day files past
``metrics.retention``, and never today's or yesterday's."""

from __future__ import annotations

from pipeline import sinks, store
from pipeline.metrics import prune_old_days, read_rows

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def write_days(data_dir, stream: str, days: list[str]) -> None:
    folder = store.metrics_dir(data_dir, stream)
    folder.mkdir(parents=True, exist_ok=True)
    for day in days:
        (folder / f"{day}.jsonl").write_text(f'{{"ts_ms": 1, "day": "{day}"}}\n')


def days_left(data_dir, stream: str) -> list[str]:
    return sorted(path.stem for path in store.metrics_dir(data_dir, stream).glob("*.jsonl"))


def test_retention_removes_whole_days_past_it_in_every_stream(tmp_path):
    days = ["2027-01-01", "2027-01-07", "2027-01-08", "2027-01-14", "2027-01-15"]
    for stream in ("progress", "events", "state"):
        write_days(tmp_path, stream, days)
    removed = prune_old_days(tmp_path, 7 * 86400, NOW)
    assert len(removed) == 6
    for stream in ("progress", "events", "state"):  # 2027-01-08 ended 6 days 8 hours ago: kept
        assert days_left(tmp_path, stream) == ["2027-01-08", "2027-01-14", "2027-01-15"]
    assert [row["day"] for row in read_rows(tmp_path, "progress")] == ["2027-01-08", "2027-01-14", "2027-01-15"]


def test_today_and_yesterday_always_stay(tmp_path):
    write_days(tmp_path, "progress", ["2027-01-13", "2027-01-14", "2027-01-15"])
    prune_old_days(tmp_path, 0, NOW)
    assert days_left(tmp_path, "progress") == ["2027-01-14", "2027-01-15"]
    assert prune_old_days(tmp_path / "fresh", 0, NOW) == []


def test_the_maintenance_round_prunes_and_records_it(tmp_path):
    write_days(tmp_path, "tasks", ["2020-01-01"])
    events = []
    maintenance = sinks.SinkMaintenance(sinks.SinkWriter(tmp_path), tmp_path, 1.0, 0,
                                        lambda kind, message, **details: events.append(kind),
                                        prune=lambda: prune_old_days(tmp_path, 86400))
    maintenance.run_once()
    assert days_left(tmp_path, "tasks") == [] and "metrics_pruned" in events
