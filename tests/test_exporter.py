"""The Prometheus exporter: a real HTTP scrape on 127.0.0.1, parsed and checked against the
metrics store and sinks read independently."""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request

import pytest

from app_fixtures import empty_data_dir, fixture_data, read_metrics, read_sink  # noqa: F401 - fixtures
from pipeline.config import load_settings
from pipeline.errors import StatefulStreamsError
from pipeline.exporter import build_exporter

SAMPLE = re.compile(r'^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$')


def _scrape(data_dir) -> tuple[str, str]:
    settings = load_settings(env={}, cli={"paths.data_dir": str(data_dir)})
    server = build_exporter(settings, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
            return response.headers["Content-Type"], response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _samples(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = SAMPLE.match(line)
        assert match, f"not exposition format: {line!r}"
        key = match["name"] + (f"{{{match['labels']}}}" if match["labels"] else "")
        samples[key] = float(match["value"])
    return samples


def test_scrape_matches_the_metrics_store(fixture_data):
    content_type, text = _scrape(fixture_data.data_dir)
    assert content_type.startswith("text/plain; version=0.0.4")
    samples = _samples(text)
    progress = read_metrics(fixture_data.data_dir, "progress")
    newest = progress[-1]
    p = "stateful_streams_"
    assert samples[p + "batches_total"] == len(progress)
    assert samples[p + "last_batch_id"] == newest["batch_id"]
    assert samples[p + "input_rows_per_second"] == newest["input_rows_per_second"]
    assert samples[p + "processed_rows_per_second"] == newest["processed_rows_per_second"]
    assert samples[p + "batch_duration_ms"] == newest["batch_duration_ms"]
    assert samples[p + "state_size_bytes"] == newest["state_size_bytes"]
    for op in newest["state"]:
        assert samples[f'{p}state_rows{{operator="{op["operator"]}"}}'] == op["rows_total"]
    for sink in ("enriched", "missing_state", "dead_letter"):
        assert samples[f'{p}sink_rows_total{{sink="{sink}"}}'] == sum(row["sink_rows"][sink] for row in progress)
    for topic in newest["topics"]:
        assert samples[f'{p}backlog_messages{{topic="{topic["topic"]}"}}'] == topic["latest_position"] - topic["end_position"]
    events = read_metrics(fixture_data.data_dir, "events")
    assert samples[p + "restarts_total"] == sum(e["kind"] == "restart" for e in events) == 1
    assert samples[p + "dead_letters_total"] == len(read_sink(fixture_data.data_dir, "dead_letter"))
    assert sum(v for k, v in samples.items() if k.startswith(p + "job_state{")) == 1
    for name in ("batches_total", "sink_rows_total", "restarts_total", "dead_letters_total"):
        assert f"# TYPE {p}{name} counter" in text
    assert f"# TYPE {p}state_rows gauge" in text and f"# HELP {p}backlog_messages " in text


def test_scrape_of_an_untouched_data_dir_has_zero_counters_and_no_invented_gauges(empty_data_dir):
    _, text = _scrape(empty_data_dir)
    samples = _samples(text)
    assert samples["stateful_streams_batches_total"] == 0
    assert samples["stateful_streams_restarts_total"] == 0
    assert samples['stateful_streams_job_state{state="not_started"}'] == 1
    assert "stateful_streams_last_batch_id" not in samples  # unknown, so left out


def test_other_paths_are_not_found(empty_data_dir):
    settings = load_settings(env={}, cli={"paths.data_dir": str(empty_data_dir)})
    server = build_exporter(settings, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/", timeout=10)
        assert error.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_a_busy_port_is_a_one_line_error(empty_data_dir):
    settings = load_settings(env={}, cli={"paths.data_dir": str(empty_data_dir)})
    first = build_exporter(settings, port=0)
    try:
        with pytest.raises(StatefulStreamsError, match=r"cannot listen on 127\.0\.0\.1:\d+ .*pick another --port"):
            build_exporter(settings, port=first.server_address[1])
    finally:
        first.server_close()
