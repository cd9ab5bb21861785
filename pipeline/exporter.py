"""The Prometheus exporter: the job's metrics store in Prometheus text format on 127.0.0.1.

``python -m pipeline exporter --port 9464`` serves ``GET /metrics`` (text exposition format
0.0.4). Every scrape reads the metrics store and the sinks afresh through the console's
queries (``app.queries``, which import no Streamlit), so the numbers match the console's.
Scrape it with a Prometheus job such as::

    scrape_configs:
      - job_name: stateful-streams
        static_configs: [{targets: ["127.0.0.1:9464"]}]

Counters are totals over the whole metrics store; gauges describe the newest micro-batch.
"""

from __future__ import annotations

import logging
import math
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterable

import pandas as pd

from app import console_math, metric_queries, queries  # the console's data layer; it imports no Streamlit
from app.sources import connect
from pipeline.config import Settings
from pipeline.errors import StatefulStreamsError

log = logging.getLogger(__name__)

BIND_ADDRESS = "127.0.0.1"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "stateful_streams_"
JOB_STATES = ("not_started", "running", "stalled", "restarting", "failed", "stopped")

Sample = tuple[dict[str, str], float | int | None]


def _family(name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> list[str]:
    """One metric family: its HELP and TYPE lines and one line per sample with a value."""
    lines = [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}"]
    for labels, value in samples:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue  # unknown: leave the sample out rather than invent a number
        label_text = ",".join(f'{key}="{_escape(str(val))}"' for key, val in labels.items())
        lines.append(f"{PREFIX}{name}{{{label_text}}} {_number(value)}" if label_text else f"{PREFIX}{name} {_number(value)}")
    return lines


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float | int) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _value(row, column: str) -> float | int | None:
    return _present(row[column])


def _present(value) -> float | int | None:
    """The value, or None for the frames' missing markers (None, NaN, pd.NA)."""
    return None if pd.isna(value) else value


def render_metrics(connection, data_dir: Path, now_ms: int) -> str:
    """The exposition text for the metrics store and sinks under ``data_dir``."""
    totals = metric_queries.load_progress_totals(connection, data_dir).iloc[0]
    newest = metric_queries.load_batches(connection, data_dir, limit=1)
    state = metric_queries.load_state_by_operator(connection, data_dir)
    backlog = metric_queries.load_backlog(connection, data_dir, limit=1)
    events = metric_queries.load_event_counts(connection, data_dir).set_index("kind")["events"]
    sinks = queries.load_sink_spans(connection, data_dir).set_index("sink")["rows"]
    status = console_math.job_status_from_frames(metric_queries.load_latest_lifecycle_event(connection, data_dir), newest, now_ms)
    batch = newest.iloc[-1] if not newest.empty else None

    def latest(column: str) -> list[Sample]:
        return [({}, None if batch is None else _value(batch, column))]

    ratio = None if batch is None else console_math.compute_backpressure_ratio(
        _value(batch, "batch_duration_ms"), _value(batch, "trigger_interval_ms"))
    lines: list[str] = []
    lines += _family("batches_total", "counter", "Micro-batches the job completed (progress rows).",
                     [({}, int(totals["batches"]))])
    lines += _family("last_batch_id", "gauge", "Id of the newest completed micro-batch.", latest("batch_id"))
    lines += _family("last_batch_timestamp_seconds", "gauge", "Trigger time of the newest micro-batch (Unix seconds).",
                     [({}, None if batch is None else int(batch["ts_ms"]) / 1000)])
    lines += _family("input_rows_per_second", "gauge", "Input rate of the newest micro-batch.",
                     latest("input_rows_per_second"))
    lines += _family("processed_rows_per_second", "gauge", "Processing rate of the newest micro-batch.",
                     latest("processed_rows_per_second"))
    lines += _family("batch_duration_ms", "gauge", "Duration of the newest micro-batch in milliseconds.",
                     latest("batch_duration_ms"))
    lines += _family("trigger_interval_ms", "gauge", "Trigger interval of the job in milliseconds.",
                     latest("trigger_interval_ms"))
    lines += _family("backpressure_ratio", "gauge",
                     "Share of the newest batch's time spent past its trigger interval (0-1; OK <= 0.1, LOW <= 0.5).",
                     [({}, ratio)])
    lines += _family("state_rows", "gauge", "Rows in each stateful operator's state (newest batch).",
                     [({"operator": row.operator}, row.rows_total) for row in state.itertuples()])
    lines += _family("state_memory_bytes", "gauge", "Memory used by each stateful operator's state (newest batch).",
                     [({"operator": row.operator}, row.memory_bytes) for row in state.itertuples()])
    lines += _family("state_size_bytes", "gauge", "Size on disk of the state store (newest batch).",
                     latest("state_size_bytes"))
    lines += _family("sink_rows_total", "counter", "Rows written to each sink, summed over the progress rows.",
                     [({"sink": "enriched"}, int(totals["enriched_rows"])),
                      ({"sink": "missing_state"}, int(totals["missing_rows"])),
                      ({"sink": "dead_letter"}, int(totals["dead_letter_rows"]))])
    lines += _family("backlog_messages", "gauge", "Messages on each topic the job has not read yet (newest batch).",
                     [({"topic": row.topic}, _present(row.backlog)) for row in backlog.itertuples()])
    lines += _family("restarts_total", "counter", "Restarts of the job from its last checkpoint (restart events).",
                     [({}, int(events.get("restart", 0)))])
    lines += _family("dead_letters_total", "counter", "Committed rows in the dead_letter sink.",
                     [({}, int(sinks.get("dead_letter", 0)))])
    lines += _family("job_up", "gauge", "1 while the job is running and writing batches, else 0.",
                     [({}, int(status.state == "running"))])
    lines += _family("job_state", "gauge", "The job's state as the console shows it: 1 for the current state.",
                     [({"state": state_name}, int(status.state == state_name)) for state_name in JOB_STATES])
    return "\n".join(lines) + "\n"


def build_exporter(settings: Settings, port: int) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1:``port`` (0 = any free port) serving ``/metrics``; not started."""
    connection = connect()
    data_dir = settings.data_dir

    class MetricsHandler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            if self.path.split("?", 1)[0] != "/metrics":
                self._reply(404, "text/plain; charset=utf-8", "not found; metrics are at /metrics\n")
                return
            try:
                with connection.cursor() as cursor:  # one cursor per request thread
                    body = render_metrics(cursor, data_dir, int(time.time() * 1000))
            except Exception as exc:  # a scrape must get an answer, and the exporter must keep serving
                log.exception("cannot render metrics")
                self._reply(500, "text/plain; charset=utf-8", f"cannot read the metrics store: {exc}\n")
                return
            self._reply(200, CONTENT_TYPE, body)

        def _reply(self, status: int, content_type: str, body: str) -> None:
            payload = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - the http.server API
            log.debug("%s %s", self.address_string(), format % args)

    try:
        server = ThreadingHTTPServer((BIND_ADDRESS, port), MetricsHandler)
    except OSError as exc:
        raise StatefulStreamsError(f"exporter cannot listen on {BIND_ADDRESS}:{port} ({exc}); pick another --port") from exc
    server.daemon_threads = True
    return server


def serve_exporter(settings: Settings, port: int) -> None:
    """Serve ``/metrics`` on 127.0.0.1:``port`` in the foreground until interrupted."""
    server = build_exporter(settings, port)
    host, bound_port = server.server_address[:2]
    print(f"exporter: http://{host}:{bound_port}/metrics (data dir {settings.data_dir})", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
