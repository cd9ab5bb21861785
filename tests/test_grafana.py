"""The Grafana dashboard (app/monitoring/): every expression names only metrics and labels the
exporter serves, it shows the book's monitoring views, and a real Prometheus evaluates every
expression over a scrape of the exporter."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.exporter import start_exporter
from app_fixtures import write_data_dir
from pipeline.config import load_settings
from test_prometheus import _api, prometheus_factory  # noqa: F401 - fixture
from waiting import wait_for

DASHBOARD = Path(__file__).resolve().parent.parent / "app" / "monitoring" / "stateful-streams-dashboard.json"
# PromQL words that are not metric names: functions, aggregations, modifiers, keywords
PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "by", "without", "rate", "irate", "increase", "delta", "deriv",
    "histogram_quantile", "topk", "bottomk", "quantile", "abs", "clamp_min", "clamp_max", "avg_over_time",
    "max_over_time", "min_over_time", "sum_over_time", "and", "or", "unless", "on", "ignoring", "group_left",
    "group_right", "offset", "bool", "time", "vector", "scalar", "label_replace", "inf", "nan",
}
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def load_expressions() -> list[tuple[str, str]]:
    """``(panel title, expr)`` for every query of every panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for inner in [panel] + panel.get("panels", []):
            for target in inner.get("targets", []):
                found.append((inner["title"], target["expr"]))
    return found


def parse_expression(expr: str) -> tuple[set[str], set[tuple[str, str]]]:
    """The metric names an expression reads, and the ``(metric, label)`` pairs it matches or groups by."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    labels: set[tuple[str, str]] = set()
    for metric, matchers in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", without_strings):
        labels |= {(metric, name) for name in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*=~?", matchers)}
    grouped = {name for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", without_strings)
               for name in _IDENTIFIER.findall(group)}
    bare = re.sub(r"\b(?:by|without)\s*\([^)]*\)", " ", without_strings)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    names = {word for word in _IDENTIFIER.findall(bare) if word.lower() not in PROMQL_WORDS}
    labels |= {(metric, name) for metric in names for name in grouped}
    return names, labels


@pytest.fixture(scope="module")
def job_and_pipeline(tmp_path_factory) -> Path:
    """A data dir with the job's store, as the app fixtures write it, and a SQL pipeline's."""
    from pipeline import store
    from pipeline.metrics import MetricsStore

    data_dir = tmp_path_factory.mktemp("grafana") / "data"
    write_data_dir(data_dir)
    pipeline = MetricsStore(store.sql_dir(data_dir, "counts"))
    for batch in range(3):
        pipeline.append("progress", {"ts_ms": 1_800_000_000_000 + batch * 1_000, "batch_id": batch, "rows_in": 5,
                                     "rows_out": 2, "dead_letters": 0, "lag": 0, "topics": []})
    pipeline.event("restart", "restart 1/3 in 1s after: boom")
    return data_dir


@pytest.fixture(scope="module")
def served(job_and_pipeline) -> dict[str, set[str]]:
    """Sample name -> its label names, as the exporter serves them over that data dir."""
    exporter = start_exporter(load_settings(env={}, cli={"paths.data_dir": str(job_and_pipeline)}), port=0)
    try:
        import urllib.request

        with urllib.request.urlopen(exporter.url, timeout=10) as response:
            text = response.read().decode()
    finally:
        exporter.close()
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def test_parse_expression_finds_metrics_and_labels():
    names, labels = parse_expression(
        'histogram_quantile(0.99, sum by (le) (rate(a_bucket{phase=~"x|y"}[5m]))) / b_total')
    assert names == {"a_bucket", "b_total"}
    # a by() label is checked against every metric of the expression (the dashboard groups single-metric terms)
    assert labels == {("a_bucket", "phase"), ("a_bucket", "le"), ("b_total", "le")}


def test_every_expression_names_only_metrics_and_labels_the_exporter_serves(served):
    expressions = load_expressions()
    assert len(expressions) >= 10
    for title, expr in expressions:
        names, labels = parse_expression(expr)
        assert names, f"{title}: {expr!r} reads no metric"
        for name in names:
            assert name in served, f"{title}: {expr!r} reads {name!r}, which the exporter does not serve"
        for metric, label in labels:
            if metric in served:
                assert label in served[metric] or (label == "le" and metric.endswith("_bucket")), \
                    f"{title}: {expr!r} uses label {label!r}, which {metric} does not have"


def test_the_dashboard_shows_the_monitoring_views():
    dashboard = json.loads(DASHBOARD.read_text())
    rows = {panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"}
    assert {"Throughput", "Latency", "Backpressure", "Checkpoints", "State"} <= rows
    read = {name for _, expr in load_expressions() for name in parse_expression(expr)[0]}
    for metric in ("stateful_streams_processed_rows_per_second", "stateful_streams_sink_rows_total",
                   "stateful_streams_end_to_end_latency_seconds_bucket", "stateful_streams_backpressure_ratio",
                   "stateful_streams_backlog_entries", "stateful_streams_batch_phase_duration_ms",
                   "stateful_streams_state_rows", "stateful_streams_state_size_bytes"):
        assert metric in read, metric
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "stateful-streams"


def test_prometheus_evaluates_every_expression(job_and_pipeline, prometheus_factory):
    exporter = start_exporter(load_settings(env={}, cli={"paths.data_dir": str(job_and_pipeline)}), port=0)
    try:
        host, port = exporter.address
        base = prometheus_factory([f"{host}:{port}"])

        def scrapes(count: int):
            def done():
                try:
                    result = _api(base, "query", query="count_over_time(stateful_streams_batches_total[1m])")["result"]
                except OSError:
                    return False
                return result and float(result[0]["value"][1]) >= count
            return done

        wait_for(scrapes(3), timeout=60, what="three scrapes of the exporter")  # rate() needs two
        for title, expr in load_expressions():
            result = _api(base, "query", query=expr)["result"]  # a syntax error fails in _api
            assert result, f"{title}: {expr!r} returned no series"
    finally:
        exporter.close()
