"""Topic set-up: through the admin REST API (with the token when one is set) or the broker itself."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.config import load_settings
from pipeline.feed.topics import ensure_topics, make_client


@pytest.fixture
def admin_api():
    """A loopback HTTP server standing in for Pulsar's admin API: records each request, answers 204."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            seen.append({"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"),
                         "body": json.loads(self.rfile.read(length) or b"null")})
            self.send_response(204)
            self.end_headers()

        do_PUT = do_POST = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", seen
    server.shutdown()
    server.server_close()


def test_admin_calls_carry_the_token_and_set_changelog_retention(admin_api, tmp_path):
    url, seen = admin_api
    settings = load_settings(env={}, cli={"pulsar.admin_url": url, "pulsar.auth_token": "t" * 20,
                                          "paths.data_dir": str(tmp_path)})
    ensure_topics(settings, "pulsar://127.0.0.1:1", partitions=3)
    assert {request["auth"] for request in seen} == {"Bearer " + "t" * 20}
    assert [r["body"] for r in seen if r["path"].endswith("/partitions")] == [3, 3, 3]
    retention = [r["path"] for r in seen if r["path"].endswith("/retention")]
    assert len(retention) == 2 and all("/users/" in p or "/items/" in p for p in retention)


def test_admin_calls_without_a_token_send_no_authorization(admin_api, tmp_path):
    url, seen = admin_api
    ensure_topics(load_settings(env={}, cli={"pulsar.admin_url": url, "paths.data_dir": str(tmp_path)}))
    assert seen and all(request["auth"] is None for request in seen)


def test_a_client_with_a_token_still_talks_to_a_broker_without_auth(broker):
    client = make_client(broker.service_url, token="x" * 20)
    try:
        client.create_producer("persistent://public/default/token-probe").close()
    finally:
        client.close()
