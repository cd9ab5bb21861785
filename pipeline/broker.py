"""The embedded pulsar-lite broker: our own launcher, and how every process finds a broker.

:class:`EmbeddedBroker` starts the ``pulsar-lite`` binary from the PyPI package on
127.0.0.1 and a free port, with a config file that turns its metrics endpoint off (it would
otherwise listen on all interfaces), data under ``<data_dir>/broker/``, and a parent-death
signal so it never outlives the process that started it.

A running embedded broker writes ``<data_dir>/broker/endpoint.json``; :func:`resolve_service_url`
reads it so the producers, the job and the console all reach the same broker.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import Settings
from pipeline.errors import BrokerError

_PR_SET_PDEATHSIG = 1
BROKER_CONFIG = """\
# Written by pipeline/broker.py. Metrics are off: pulsar-lite would bind 0.0.0.0:8080 otherwise.
[metrics]
enabled = false
"""


def find_free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def find_binary() -> Path:
    """The pulsar-lite executable shipped inside the pulsar-lite wheel."""
    try:
        import pulsar_lite
    except ImportError as exc:
        raise BrokerError("the embedded broker needs the 'pulsar-lite' package: pip install -r requirements.txt") from exc
    binary = Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite"
    if not binary.exists():
        raise BrokerError(f"pulsar-lite binary not found at {str(binary)!r}; reinstall pulsar-lite")
    return binary


def die_with_parent() -> None:
    """``preexec_fn`` for children that must not outlive us: SIGTERM when the parent dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def port_is_open(host: str, port: int, timeout: float = 0.25) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class EmbeddedBroker:
    """One pulsar-lite process. Use as a context manager, or call start() and stop().

    Lifecycle: ``start()`` returns once the port accepts connections (or raises BrokerError
    within ``timeout`` seconds); ``stop()`` terminates it and removes the endpoint file.
    The broker also receives SIGTERM if the starting process dies (PR_SET_PDEATHSIG).
    """

    data_dir: Path
    port: int = 0
    process: subprocess.Popen | None = None

    @property
    def broker_dir(self) -> Path:
        return Path(self.data_dir) / "broker"

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def endpoint_file(self) -> Path:
        return self.broker_dir / "endpoint.json"

    def start(self, timeout: float = 20.0) -> "EmbeddedBroker":
        binary = find_binary()
        config = self.broker_dir / "pulsar-lite.toml"
        try:
            self.broker_dir.mkdir(parents=True, exist_ok=True)
            config.write_text(BROKER_CONFIG)
            log = open(self.broker_dir / "broker.log", "ab")
        except OSError as exc:
            raise BrokerError(f"cannot write the broker's files under {str(self.broker_dir)!r} "
                              f"({exc.strerror or exc}); set paths.data_dir to a writable folder") from exc
        self.port = self.port or find_free_port()
        try:
            self.process = subprocess.Popen(
                [str(binary), "--config", str(config), "--addr", f"127.0.0.1:{self.port}",
                 "--db-path", str(self.broker_dir / "db"), "--log-level", "warn"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                cwd=str(self.broker_dir), preexec_fn=die_with_parent,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not port_is_open("127.0.0.1", self.port):
            if self.process.poll() is not None:
                raise BrokerError(
                    f"pulsar-lite exited with code {self.process.returncode} on 127.0.0.1:{self.port}; "
                    f"see {str(self.broker_dir / 'broker.log')!r}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"pulsar-lite did not listen on 127.0.0.1:{self.port} within {timeout:.0f}s")
            time.sleep(0.05)
        self.endpoint_file.write_text(json.dumps({"service_url": self.service_url, "pid": self.process.pid}))
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:
            current = json.loads(self.endpoint_file.read_text())
            if self.process is not None and current.get("pid") == self.process.pid:
                self.endpoint_file.unlink()
        except (OSError, ValueError):
            pass

    def __enter__(self) -> "EmbeddedBroker":
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def running_embedded_url(data_dir: Path) -> str | None:
    """The URL of a live embedded broker for this data dir, if one is running."""
    endpoint = Path(data_dir) / "broker" / "endpoint.json"
    try:
        info = json.loads(endpoint.read_text())
        url, pid = info["service_url"], int(info["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    host, _, port = url.removeprefix("pulsar://").partition(":")
    return url if port.isdigit() and port_is_open(host, int(port)) else None


def resolve_service_url(settings: Settings) -> str:
    """The broker URL this process should use: the configured one, or the running embedded one."""
    if not settings.is_embedded:
        return settings.service_url
    url = running_embedded_url(settings.data_dir)
    if url is None:
        raise BrokerError(
            f"pulsar.service_url is 'embedded' but no embedded broker runs for data dir "
            f"{str(settings.data_dir)!r}; start one with 'python -m pipeline broker'"
        )
    return url


def serve_forever(settings: Settings) -> None:
    """``python -m pipeline broker``: run the embedded broker in the foreground until Ctrl-C."""
    broker = EmbeddedBroker(settings.data_dir)
    existing = running_embedded_url(settings.data_dir)
    if existing:
        raise BrokerError(f"an embedded broker already runs for this data dir at {existing}")
    with broker:
        from pipeline.topics import ensure_topics

        ensure_topics(settings.with_overrides(pulsar__service_url=broker.service_url))
        print(broker.service_url, flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            while broker.process.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        if broker.process.poll() not in (None, 0, -signal.SIGTERM):
            raise BrokerError(f"pulsar-lite stopped with code {broker.process.returncode}")
