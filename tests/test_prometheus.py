"""A real Prometheus server (Debian's ``prometheus``, installed by ``make system-deps``) scrapes
the exporter on loopback, and the metrics read back through Prometheus's HTTP query API match
the metrics store."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from app.exporter import start_exporter
from app_fixtures import fixture_data, read_metrics  # noqa: F401 - fixtures
from pipeline.feed.broker import die_with_parent
from pipeline.feed.ports import find_free_port
from pipeline.config import load_settings
from waiting import wait_for

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def _api(base: str, path: str, **params) -> dict:
    url = f"{base}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


@pytest.fixture
def prometheus_factory(tmp_path):
    """Start Prometheus on 127.0.0.1 scraping the given targets twice a second; stopped after the test."""
    if not Path(PROMETHEUS).exists():
        pytest.fail("Debian's prometheus is not installed; run `make system-deps`")
    started: list[subprocess.Popen] = []

    def start(targets: list[str]) -> str:
        port = find_free_port()
        config = tmp_path / "prometheus.yml"
        # JSON is YAML: the generated config needs no YAML writer
        config.write_text(json.dumps({
            "global": {"scrape_interval": "500ms", "scrape_timeout": "500ms", "evaluation_interval": "500ms"},
            "scrape_configs": [{"job_name": "stateful-streams", "static_configs": [{"targets": targets}]}],
        }))
        log = (tmp_path / "prometheus.log").open("w")
        process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        started.append(process)
        return f"http://127.0.0.1:{port}"

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_prometheus_scrapes_the_exporter_and_answers_queries(fixture_data, prometheus_factory):
    exporter = start_exporter(load_settings(env={}, cli={"paths.data_dir": str(fixture_data.data_dir)}), port=0)
    try:
        host, port = exporter.address
        base = prometheus_factory([f"{host}:{port}"])

        def scraped_and_up():
            try:
                targets = _api(base, "targets")["activeTargets"]
            except OSError:
                return None  # not listening yet
            return targets and targets[0]["health"] == "up" and targets[0]

        target = wait_for(scraped_and_up, timeout=60, what="Prometheus to scrape the exporter")
        assert target["scrapeUrl"] == exporter.url

        def query(expr: str) -> list:
            return wait_for(lambda: _api(base, "query", query=expr)["result"], timeout=30, what=expr)

        progress = read_metrics(fixture_data.data_dir, "progress")
        [batches] = query("stateful_streams_batches_total")
        assert float(batches["value"][1]) == len(progress)
        assert batches["metric"]["job"] == "stateful-streams"
        enriched = query('stateful_streams_sink_rows_total{sink="enriched"}')
        assert float(enriched[0]["value"][1]) == sum(row["sink_rows"]["enriched"] for row in progress)
        state = {r["metric"]["operator"]: float(r["value"][1]) for r in query("stateful_streams_state_rows")}
        assert state == {op["operator"]: op["rows_total"] for op in progress[-1]["state"]}
        [p99] = query("histogram_quantile(0.99, stateful_streams_end_to_end_latency_seconds_bucket)")
        assert 0 < float(p99["value"][1]) <= 300
    finally:
        exporter.close()
