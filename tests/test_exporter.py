"""The Prometheus exporter (app/exporter.py): a real HTTP scrape on 127.0.0.1, parsed with
prometheus_client's own parser and checked against the metrics store and sinks read independently;
the CLI entry as a real process."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.exporter import LATENCY_BUCKETS_S, METRICS, start_exporter
from app_fixtures import empty_data_dir, fixture_data, read_metrics, read_sink  # noqa: F401 - fixtures
from pipeline.config import load_settings
from pipeline.errors import StatefulStreamsError
from pipeline.feed.ports import find_free_port
from waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
P = "stateful_streams_"


def _get(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.headers["Content-Type"], response.read().decode()


def _scrape(data_dir) -> tuple[str, str]:
    exporter = start_exporter(load_settings(env={}, cli={"paths.data_dir": str(data_dir)}), port=0)
    try:
        assert exporter.address[0] == "127.0.0.1"
        return _get(exporter.url)
    finally:
        exporter.close()


def _samples(text: str) -> dict[str, float]:
    """``{'name{a="b"}': value}`` for every sample, parsed by prometheus_client."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k != "le")
            le = sample.labels.get("le")
            key = sample.name + (f"{{{labels}}}" if labels else "") + (f"[le={float(le)}]" if le else "")
            samples[key] = sample.value
    return samples


def test_scrape_matches_the_metrics_store(fixture_data):
    content_type, text = _scrape(fixture_data.data_dir)
    assert content_type.startswith("text/plain")
    samples = _samples(text)
    progress = read_metrics(fixture_data.data_dir, "progress")
    newest = progress[-1]
    assert samples[P + "batches_total"] == len(progress)
    assert samples[P + "last_batch_id"] == newest["batch_id"]
    assert samples[P + "input_rows_per_second"] == newest["input_rows_per_second"]
    assert samples[P + "processed_rows_per_second"] == newest["processed_rows_per_second"]
    assert samples[P + "batch_duration_ms"] == newest["batch_duration_ms"]
    assert samples[P + "state_size_bytes"] == newest["state_size_bytes"]
    for phase, ms in newest["duration_ms"].items():
        assert samples[f'{P}batch_phase_duration_ms{{phase="{phase}"}}'] == ms
    for op in newest["state"]:
        assert samples[f'{P}state_rows{{operator="{op["operator"]}"}}'] == op["rows_total"]
        assert samples[f'{P}state_commit_ms{{operator="{op["operator"]}"}}'] == op["commit_ms"]
    for sink in ("enriched", "missing_state", "dead_letter"):
        assert samples[f'{P}sink_rows_total{{sink="{sink}"}}'] == sum(row["sink_rows"][sink] for row in progress)
    for topic in newest["topics"]:
        assert samples[f'{P}backlog_entries{{topic="{topic["topic"]}"}}'] == topic["latest_position"] - topic["end_position"]
    events = read_metrics(fixture_data.data_dir, "events")
    assert samples[P + "restarts_total"] == sum(e["kind"] == "restart" for e in events) == 1
    assert samples[P + "dead_letters_total"] == len(read_sink(fixture_data.data_dir, "dead_letter"))
    assert sum(v for k, v in samples.items() if k.startswith(P + "job_state{")) == 1
    for name in ("batches_total", "sink_rows_total", "restarts_total", "dead_letters_total"):
        assert f"# TYPE {P}{name} counter" in text
    assert f"# TYPE {P}state_rows gauge" in text and f"# HELP {P}backlog_entries " in text
    assert f"# TYPE {P}end_to_end_latency_seconds histogram" in text


def test_scrape_serves_what_the_planner_admitted_and_the_orders_shared(fixture_data):
    samples = _samples(_scrape(fixture_data.data_dir)[1])
    newest = read_metrics(fixture_data.data_dir, "progress")[-1]
    for topic in newest["topics"]:
        assert samples[f'{P}admitted_messages{{topic="{topic["topic"]}"}}'] == topic["admitted_messages"]
        assert samples[f'{P}admitted_bytes{{topic="{topic["topic"]}"}}'] == topic["admitted_bytes"]
    assert (samples[P + "orders_held"], samples[P + "orders_sharing"]) == (newest["orders_held"], newest["orders_shared"]) == (0, 0)
    ended = [e["details"]["orders"] for e in read_metrics(fixture_data.data_dir, "events") if e["kind"] == "orders_share_ended"]
    assert samples[P + "orders_shared_total"] == sum(ended) == fixture_data.shared_orders > 0


def test_a_batch_holding_orders_back_and_rows_from_before_the_planner(tmp_path):
    from pipeline.metrics import MetricsStore

    metrics, base = MetricsStore(tmp_path), 1_800_000_000_000
    old_topic = {"topic": "orders", "generation": 0, "rows": 4, "end_position": 4, "latest_position": 4, "backlog": 0}
    metrics.append("progress", {"ts_ms": base, "batch_id": 0, "topics": [old_topic]})
    text = _scrape(tmp_path)[1]
    samples = _samples(text)
    for unknown in ("admitted_messages", "admitted_bytes", "orders_held", "orders_sharing"):
        assert not any(name.startswith(P + unknown) for name in samples), unknown  # unknown, so left out
    assert samples[P + "orders_shared_total"] == 0
    metrics.append("progress", {"ts_ms": base + 1000, "batch_id": 1, "orders_held": True, "orders_shared": False,
                                "orders_held_for": 4, "topics": [{**old_topic, "rows": 0, "admitted_messages": 0,
                                                                  "admitted_bytes": 0}]})
    samples = _samples(_scrape(tmp_path)[1])
    assert (samples[P + "orders_held"], samples[P + "orders_sharing"]) == (1, 0)
    assert samples[f'{P}admitted_messages{{topic="orders"}}'] == 0


def test_latency_histogram_counts_every_committed_enriched_order(fixture_data):
    samples = _samples(_scrape(fixture_data.data_dir)[1])
    enriched = read_sink(fixture_data.data_dir, "enriched")
    latency_s = (enriched["enriched_at"] - enriched["published_at"]).dt.total_seconds().dropna()
    name = P + "end_to_end_latency_seconds"
    assert samples[name + "_count"] == len(latency_s) > 0
    assert samples[name + "_sum"] == pytest.approx(latency_s.sum())
    for bound in LATENCY_BUCKETS_S:
        assert samples[f"{name}_bucket[le={bound}]"] == (latency_s <= bound).sum(), bound
    assert samples[f"{name}_bucket[le=inf]"] == len(latency_s)


def test_every_served_family_is_listed_and_every_listed_metric_is_served(fixture_data):
    served = {family.name: family.type for family in text_string_to_metric_families(_scrape(fixture_data.data_dir)[1])}
    # the parser names counters without _total; METRICS lists what Prometheus stores
    listed = {re.sub(r"_total$", "", name) if kind == "counter" else name: kind for name, kind in METRICS.items()}
    assert served == listed


def test_scrape_of_an_untouched_data_dir_has_zero_counters_and_no_invented_gauges(empty_data_dir):
    samples = _samples(_scrape(empty_data_dir)[1])
    assert samples[P + "batches_total"] == 0
    assert samples[P + "restarts_total"] == 0
    assert samples[P + "end_to_end_latency_seconds_count"] == 0
    assert samples[f'{P}job_state{{state="not_started"}}'] == 1
    for unknown in ("last_batch_id", "batch_duration_ms", "backpressure_ratio", "state_size_bytes"):
        assert P + unknown not in samples  # unknown, so left out


def test_a_busy_port_is_a_one_line_error(empty_data_dir):
    settings = load_settings(env={}, cli={"paths.data_dir": str(empty_data_dir)})
    first = start_exporter(settings, port=0)
    try:
        with pytest.raises(StatefulStreamsError, match=r"cannot listen on 127\.0\.0\.1:\d+ .*pick another --port") as error:
            start_exporter(settings, port=first.address[1])
        assert "\n" not in str(error.value)
    finally:
        first.close()


@pytest.mark.parametrize("port", ["70000", "-1", "0", "http"])
def test_cli_rejects_a_bad_port_with_one_line(tmp_path, port):
    result = subprocess.run([sys.executable, "-m", "pipeline", "--data-dir", str(tmp_path), "exporter", "--port", port],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert result.stderr.startswith(f"error: setting 'exporter.port' = '{port}' (from command line) is not valid")
    assert "expected a port number from 1 to 65535;" in result.stderr, result.stderr


def test_cli_serves_on_the_configured_port_and_dies_with_its_parent(empty_data_dir):
    port = find_free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SS_")} | {"SS_EXPORTER_PORT": str(port)}
    parent = subprocess.Popen([sys.executable, "-m", "pipeline", "--data-dir", str(empty_data_dir), "exporter"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        def scraped():
            try:
                return _get(url)[1]
            except OSError:
                assert parent.poll() is None, parent.communicate()
                return None

        assert P + "batches_total 0.0" in wait_for(scraped, timeout=60, what="the exporter's first answer")
    finally:
        parent.terminate()
        parent.wait(timeout=30)

    def refused():
        try:
            _get(url)
        except OSError:
            return True
        return False

    wait_for(refused, timeout=30, what="the exporter process to stop with its parent")


def test_pipeline_never_imports_app():
    """The data flows one way: the job's package never imports the reading side."""
    offenders = []
    for path in (ROOT / "pipeline").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}: {name}" for name in names if name == "app" or name.startswith("app.")]
    assert not offenders


def test_each_sql_pipeline_has_its_rows_dead_letters_lag_and_restarts(tmp_path):
    """Per pipeline, from its own store (<data_dir>/sql/<name>/metrics/): totals over its progress
    rows and restart events, and its newest batch's lag; a pipeline that appears and rows appended
    between two scrapes of one exporter are counted, each once."""
    from pipeline import store
    from pipeline.metrics import MetricsStore

    def batch(batch_id: int, rows_in: int, rows_out: int, dead: int, lag: int | None) -> dict:
        return {"ts_ms": 1_800_000_000_000 + batch_id * 1_000, "batch_id": batch_id, "rows_in": rows_in,
                "rows_out": rows_out, "dead_letters": dead, "lag": lag, "topics": []}

    counts = MetricsStore(store.sql_dir(tmp_path, "counts"))
    for row in (batch(0, 10, 4, 1, 7), batch(1, 5, 2, 0, 3)):
        counts.append("progress", row)
    counts.event("restart", "restart 1/3 in 1s after: boom")
    exporter = start_exporter(load_settings(env={}, cli={"paths.data_dir": str(tmp_path)}), port=0)
    try:
        first = _samples(_get(exporter.url)[1])
        joins = MetricsStore(store.sql_dir(tmp_path, "joins"))
        joins.append("progress", batch(0, 3, 3, 0, None))
        counts.append("progress", batch(2, 1, 1, 2, 0))
        second = _samples(_get(exporter.url)[1])
    finally:
        exporter.close()
    c = '{pipeline="counts"}'
    assert (first[f"{P}sql_rows_in_total{c}"], first[f"{P}sql_rows_out_total{c}"]) == (15, 6)
    assert (first[f"{P}sql_dead_letters_total{c}"], first[f"{P}sql_restarts_total{c}"]) == (1, 1)
    assert (first[f"{P}sql_batches_total{c}"], first[f"{P}sql_lag_entries{c}"]) == (2, 3)
    assert first[f"{P}sql_last_batch_timestamp_seconds{c}"] == 1_800_000_001
    assert (second[f"{P}sql_rows_in_total{c}"], second[f"{P}sql_dead_letters_total{c}"]) == (16, 3)
    assert (second[f"{P}sql_batches_total{c}"], second[f"{P}sql_lag_entries{c}"]) == (3, 0)
    j = '{pipeline="joins"}'
    assert second[f"{P}sql_rows_out_total{j}"] == 3 and f"{P}sql_lag_entries{j}" not in second  # unknown: left out


def test_the_exporters_connection_caches_no_parquet_footers(fixture_data):
    """It reads each enriched file once, so a footer cache would only grow (issue 28: 2.6 MB/min
    at 2,000 orders/s, up to DuckDB's memory limit); the console's connection keeps its cache."""
    from app.exporter import StoreCollector
    from app.sources import connect

    collector = StoreCollector(fixture_data.data_dir)
    assert collector.connection.execute("SELECT current_setting('parquet_metadata_cache')").fetchone()[0] is False
    assert connect().execute("SELECT current_setting('parquet_metadata_cache')").fetchone()[0] is True
