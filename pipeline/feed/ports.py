"""Where our processes listen: a free loopback port for a broker, a console or a test's server.

Every process we start binds 127.0.0.1 on a port chosen here when none is configured.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_CHOSEN_PORT = 10_000  # below are the well-known and registered services' usual ports


def find_free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, outside the kernel's ephemeral range.

    The kernel hands out ephemeral ports for every ``bind(0)`` and outgoing connection, so one
    found there can be taken before the process we give it binds it. It happened: Spark's
    socket for a Python worker got an Apache Pulsar test broker's port, the broker exited, and
    the broker's readiness probe then spoke HTTP to Spark, which read "GET " as a 1.2 GB length
    and ran out of heap (a red clean-clone run, 2026-11-27). Ports outside that range are only
    ever taken by an explicit bind."""
    low, high = ephemeral_range()
    choices = [*range(LOWEST_CHOSEN_PORT, low), *range(high + 1, 65_536)]
    for port in random.sample(choices, min(len(choices), 200)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (or in TIME_WAIT): the next one
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # every one tried was taken
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ephemeral_range(path: Path = EPHEMERAL_PORTS) -> tuple[int, int]:
    """The kernel's ephemeral ports (``net.ipv4.ip_local_port_range``); Linux's default range
    where it cannot be read."""
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return 32_768, 60_999
    return low, high
