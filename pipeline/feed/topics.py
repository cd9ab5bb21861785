"""Topic set-up and the Pulsar client factory, using only the standard Pulsar protocol.

Topic creation works on any broker (a producer auto-creates the topic). Where an admin REST
API is configured (Apache Pulsar), set-up also makes the topics partitioned and gives the
changelog topics infinite retention; pulsar-lite has no admin API, so that step is skipped
with a log line.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

from pipeline.config import Settings, pulsar_admin_headers, pulsar_authentication
from pipeline.enrich.lookups import CHANGELOGS
from pipeline.errors import BrokerError

log = logging.getLogger(__name__)


def make_client(service_url: str, operation_timeout_s: int = 10, token: str | None = None):
    """A pulsar.Client that logs only errors and gives up on an unreachable broker in time;
    ``token`` (``pulsar.auth_token``) authenticates it to a Pulsar with token auth."""
    import pulsar

    try:
        return pulsar.Client(
            service_url,
            authentication=pulsar_authentication(token),
            operation_timeout_seconds=operation_timeout_s,
            connection_timeout_ms=5000,
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
    except Exception as exc:  # the C++ client raises its own error types
        raise BrokerError(f"cannot create a Pulsar client for {service_url!r}: {exc}") from exc


def _admin(method: str, url: str, body: object | None = None, headers: dict[str, str] | None = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        raise BrokerError(f"Pulsar admin API at {url!r} is unreachable: {exc}") from exc


def _admin_path(topic: str) -> str:
    # persistent://tenant/ns/name -> persistent/tenant/ns/name
    scheme, _, rest = topic.partition("://")
    return f"{scheme}/{rest}"


def ensure_topics(settings: Settings, service_url: str | None = None, partitions: int = 1) -> None:
    """Create the topics; with an admin URL also set partitions and changelog retention."""
    if settings.admin_url:
        base = settings.admin_url.rstrip("/") + "/admin/v2/"
        headers = pulsar_admin_headers(settings)
        for name, topic in settings.topics.items():
            status = _admin("PUT", base + _admin_path(topic) + "/partitions", partitions, headers)
            if status not in (200, 204, 409):
                raise BrokerError(f"creating topic {topic!r} through {settings.admin_url!r} returned HTTP {status}")
            if name in CHANGELOGS:
                status = _admin("POST", base + _admin_path(topic) + "/retention",
                                {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}, headers)
                if status not in (200, 204):
                    raise BrokerError(f"setting infinite retention on {topic!r} returned HTTP {status}")
        return
    log.info("no pulsar.admin_url: skipping partitions and retention (pulsar-lite keeps everything)")
    client = make_client(service_url or settings.service_url, token=settings["pulsar.auth_token"])
    try:
        for topic in settings.topics.values():
            try:
                client.create_producer(topic).close()
            except Exception as exc:
                raise BrokerError(f"cannot create topic {topic!r} on {service_url or settings.service_url!r}: {exc}") from exc
    finally:
        client.close()
