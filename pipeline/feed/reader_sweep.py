"""Closed readers' subscriptions on the embedded broker, found and removed by its keeper.

pulsar-lite 0.2.0 never removes a reader's subscription: closing a reader detaches it and
leaves the subscription on its topic (only an Unsubscribe removes one), and after every entry
published the broker tries each subscription of the topic in turn. The source opens a reader
per range per batch, so publishing slowed and the broker's memory grew with every batch the job
had run. Measured on one topic (2026-11-26, 2 cores): 3,000 closed readers took publishing from
74,921 to 11,473 messages/s and the broker from 18 to 70 MB; unsubscribing them brought it back
to 80,111/s. The demo's job closes about three readers a second, 3,000 in under 20 minutes.

So the keeper (pipeline/feed/broker.py ``keep_broker``) sweeps every :data:`SWEEP_S`:

- it reads the subscriptions from pulsar-lite's metadata file (``db.metadata.json``; there is
  no admin API) and keeps the source's, named after ``READER_PREFIX``
  (pipeline/source/connection.py): another client's subscription is never touched;
- one seen for :data:`STALE_S` belongs to a closed reader (a read task's reader lives at most
  its read timeout, 60 s), and is removed by subscribing to it and unsubscribing; a reader
  still open holds it (exclusive), so that subscribe fails and the sweep tries again later.

pulsar-lite keeps each name in the metadata file all the same (about 40 bytes), and would hand
an old name to the sweep again, so the sweep remembers the names it removed (about 100
bytes each in the keeper). That file still
grows with every reader opened, which is one reason long runs belong on Apache Pulsar (README).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from pipeline.source.connection import READER_PREFIX

log = logging.getLogger(__name__)

SWEEP_S = 30.0  # how often the keeper looks
STALE_S = 120.0  # seen this long: a closed reader's (a read task's reader lives at most 60 s)
SUBSCRIBE_TIMEOUT_S = 3  # an open reader's subscription refuses the sweep's subscribe this fast
METADATA_FILE = "db.metadata.json"


def source_subscriptions(metadata: dict) -> set[tuple[str, str]]:
    """(topic, subscription) of every subscription the source's readers made, from pulsar-lite's
    metadata: ``{"version": 2, "<db path>": {tenant: {namespace: {"persistent": {topic:
    {"subscriptions": {name: {}}}}}}}, "partitioned_topics": {…}}``.

    # {"/db": {"public": {"default": {"persistent": {"users": {"subscriptions": {
    #   "stateful-streams-reader-0a1b2c3d4e": {}, "audit": {}}}}}}}}
    #   -> {("persistent://public/default/users", "stateful-streams-reader-0a1b2c3d4e")}
    """
    found = set()
    for store in metadata.values():
        if not isinstance(store, dict):
            continue
        for tenant, namespaces in store.items():
            for namespace, domains in (namespaces if isinstance(namespaces, dict) else {}).items():
                topics = domains.get("persistent") if isinstance(domains, dict) else None
                for topic, facts in (topics if isinstance(topics, dict) else {}).items():
                    names = facts.get("subscriptions") if isinstance(facts, dict) else None
                    for name in names if isinstance(names, dict) else ():
                        if name.startswith(f"{READER_PREFIX}-"):
                            found.add((f"persistent://{tenant}/{namespace}/{topic}", name))
    return found


class ReaderSweep:
    """The keeper's memory between sweeps: when each subscription was first seen, and which
    ones it removed. :meth:`due` is pure; :meth:`sweep` reads the file and talks to the broker."""

    def __init__(self, broker_dir: Path, stale_s: float = STALE_S):
        self.metadata_file = Path(broker_dir) / METADATA_FILE
        self.stale_s = stale_s
        self.first_seen: dict[tuple[str, str], float] = {}
        self.removed: set[tuple[str, str]] = set()
        self.next_sweep = 0.0

    def due(self, present: set[tuple[str, str]], now: float) -> list[tuple[str, str]]:
        """The subscriptions to remove now: present, not removed before, seen for ``stale_s``."""
        self.first_seen = {sub: self.first_seen.get(sub, now) for sub in present - self.removed}
        return sorted(sub for sub, seen in self.first_seen.items() if now - seen >= self.stale_s)

    def sweep(self, service_url: str, now: float | None = None) -> int:
        """Remove the closed readers' subscriptions that are due; how many went."""
        now = time.monotonic() if now is None else now
        try:
            present = source_subscriptions(json.loads(self.metadata_file.read_text()))
        except (OSError, ValueError) as exc:  # not written yet, or caught mid-write: next time
            log.debug("cannot read %s: %s", self.metadata_file, exc)
            return 0
        due = self.due(present, now)
        if not due:
            return 0
        import pulsar

        client = pulsar.Client(service_url, operation_timeout_seconds=SUBSCRIBE_TIMEOUT_S,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        gone = 0
        try:
            for topic, name in due:
                try:
                    consumer = client.subscribe(topic, name, receiver_queue_size=1)
                    consumer.unsubscribe()
                except Exception:  # an open reader's (exclusive), or the broker is stopping: later
                    continue
                self.removed.add((topic, name))
                self.first_seen.pop((topic, name), None)
                gone += 1
        finally:
            client.close()
        return gone

    def maybe_sweep(self, service_url: str) -> int:
        """:meth:`sweep` once every :data:`SWEEP_S` (the keeper calls this from its poll loop)."""
        now = time.monotonic()
        if now < self.next_sweep:
            return 0
        self.next_sweep = now + SWEEP_S
        try:
            return self.sweep(service_url, now)
        except Exception as exc:  # the keeper must go on owning the broker whatever a sweep meets
            log.warning("the sweep of closed readers' subscriptions failed: %s", exc)
            return 0
