"""Apache Pulsar standalone from Maven Central, started by our own code the way EmbeddedBroker is.

:func:`fetch_jars` copies ``pulsar-broker`` and its dependencies (``pipeline/feed/apache_pulsar/pom.xml``,
Maven Central only) into a cache folder once (``~/.cache/stateful-streams/apache-pulsar-<version>/``,
or ``$SS_APACHE_PULSAR_CACHE``); ``make apache-pulsar`` runs it, as does
``python -m pipeline.feed.apache_broker fetch``.

:class:`ApacheBroker` runs ``org.apache.pulsar.PulsarStandaloneStarter`` on Java 17 with a
config of our own: broker, web and bookie ports free on 127.0.0.1, the RocksDB metadata store
(no ZooKeeper), no functions worker, no stream storage, data under
``<data_dir>/apache-pulsar/``, a parent-death signal so it never outlives the process that
started it, and optionally token authentication (``secret_key``). ``start()`` returns once the
admin API lists the ``public/default`` namespace the standalone creates, or raises BrokerError
within its deadline; ``stop()`` then ``start()`` again restarts it on the same ports and data.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.feed.broker import die_with_parent, port_is_open
from pipeline.feed.ports import find_free_port
from pipeline.errors import BrokerError
from pipeline.runtime.maven import cache_root, copy_jars, stamp

PULSAR_VERSION = "3.0.7"  # the 3.0 LTS line: runs on Java 17 (4.x needs Java 21)
POM_DIR = Path(__file__).parent / "apache_pulsar"
MAIN_CLASS = "org.apache.pulsar.PulsarStandaloneStarter"
ADMIN_ROLE = "admin"
# What Pulsar's own bin/pulsar opens on Java 17 (its load manager reads the JVM's container
# limits through jdk.internal.platform; netty and bookkeeper want the rest).
JAVA_OPENS = [f"--add-opens={m}=ALL-UNNAMED" for m in (
    "java.base/java.io", "java.base/java.util.zip", "java.base/sun.net", "java.base/java.lang",
    "java.base/java.nio", "java.base/sun.nio.ch", "java.base/jdk.internal.platform",
    "java.management/sun.management", "jdk.management/com.sun.management.internal")]
# A small broker for one machine: heap and direct memory capped, C1 only for a faster start.
DEFAULT_JVM_OPTIONS = ("-Xms256m", "-Xmx512m", "-XX:MaxDirectMemorySize=512m", "-XX:+UseG1GC",
                       "-XX:TieredStopAtLevel=1", "-Djava.net.preferIPv4Stack=true")

LOG4J2 = """\
<!-- Written by pipeline/feed/apache_broker.py: warnings and errors, and the standalone's start. -->
<Configuration status="warn">
  <Appenders><Console name="out" target="SYSTEM_OUT">
    <PatternLayout pattern="%d{ISO8601} %-5level [%t] %c{1} - %msg%n"/></Console></Appenders>
  <Loggers>
    <Logger name="org.apache.pulsar.PulsarStandaloneStarter" level="info"/>
    <Logger name="org.apache.pulsar.broker.PulsarService" level="info"/>
    <Root level="warn"><AppenderRef ref="out"/></Root>
  </Loggers>
</Configuration>
"""


def cache_dir() -> Path:
    """Where the jars of this Pulsar version are kept between runs."""
    return cache_root() / f"apache-pulsar-{PULSAR_VERSION}"


def fetch_jars(quiet: bool = True) -> Path:
    """The folder of the broker's jars, copied from Maven Central by ``mvn`` on the first call
    (about 200 MB, under a minute on a warm network) and cached: later calls return at once."""
    return copy_jars(POM_DIR / "pom.xml", cache_dir() / "lib", f"pulsar-broker-{PULSAR_VERSION}.jar",
                     f"Apache Pulsar {PULSAR_VERSION}", (f"-Dpulsar.version={PULSAR_VERSION}",), quiet)


def find_jars() -> Path:
    lib = cache_dir() / "lib"
    if not stamp(lib).exists():
        raise BrokerError(f"Apache Pulsar {PULSAR_VERSION} is not fetched (no {str(lib)!r}); "
                          f"run 'make apache-pulsar' or 'python -m pipeline.feed.apache_broker fetch'")
    return lib


def find_java() -> str:
    """A Java 17 runtime: Pulsar 3.0 is built and tested on it (newer JDKs drop what it needs)."""
    for home in (os.environ.get("SS_APACHE_PULSAR_JAVA_HOME"), "/usr/lib/jvm/java-17-openjdk-amd64"):
        if home and (Path(home) / "bin" / "java").exists():
            return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise BrokerError("Apache Pulsar needs a Java 17 runtime: apt-get install openjdk-17-jre-headless")
    return java


def make_token(secret_key: bytes, subject: str) -> str:
    """An HS256 JWT for ``subject`` signed with ``secret_key``, as ``pulsar tokens create`` makes."""
    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": subject}).encode())
    signature = hmac.new(secret_key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(signature)}"


@dataclass
class ApacheBroker:
    """One Apache Pulsar standalone JVM. Use as a context manager, or call start() and stop().

    Lifecycle: ``start()`` returns once the broker serves ``public/default`` (or raises
    BrokerError within ``timeout`` seconds, leaving no process); ``stop()`` sends SIGTERM and
    waits for the broker to close its ledgers (SIGKILL after ``stop_timeout``). The ports are
    picked once, so a stop and a start restart it where clients expect it, on the same data.
    The JVM also receives SIGTERM if the starting process dies (PR_SET_PDEATHSIG).
    With ``secret_key`` set, clients and the admin API need a token (:meth:`token`).
    """

    data_dir: Path
    broker_port: int = 0
    web_port: int = 0
    bookie_port: int = 0
    secret_key: bytes | None = None
    jvm_options: tuple[str, ...] = DEFAULT_JVM_OPTIONS
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def broker_dir(self) -> Path:
        return Path(self.data_dir) / "apache-pulsar"

    @property
    def service_url(self) -> str:
        return f"pulsar://127.0.0.1:{self.broker_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def log_file(self) -> Path:
        return self.broker_dir / "broker.log"

    @property
    def endpoint_file(self) -> Path:
        return self.broker_dir / "endpoint.json"

    def token(self, subject: str = ADMIN_ROLE) -> str | None:
        """A token for ``subject`` (the super-user by default); None without token auth."""
        return make_token(self.secret_key, subject) if self.secret_key else None

    def config_text(self) -> str:
        lines = [
            "# Written by pipeline/feed/apache_broker.py: loopback only, one bookie, RocksDB metadata store.",
            "clusterName=standalone",
            "bindAddress=127.0.0.1",
            "advertisedAddress=127.0.0.1",
            f"brokerServicePort={self.broker_port}",
            f"webServicePort={self.web_port}",
            "managedLedgerDefaultEnsembleSize=1",
            "managedLedgerDefaultWriteQuorum=1",
            "managedLedgerDefaultAckQuorum=1",
            # our topics are written once and read by non-durable readers: keep them while idle
            "brokerDeleteInactiveTopicsEnabled=false",
            "allowAutoTopicCreation=true",
            "allowAutoTopicCreationType=non-partitioned",
            "systemTopicEnabled=true",
            "topicLevelPoliciesEnabled=true",
            "brokerShutdownTimeoutMs=10000",
            "statusFilePath=",
            # the load manager cannot read a VM's NIC speed and refuses to start without this
            "loadBalancerOverrideBrokerNicSpeedGbps=10",
            # the bookie (the same file configures it): on loopback, at our port, small caches
            "allowLoopback=true",
            "allowEphemeralPorts=true",
            "listeningInterface=lo",
            "httpServerEnabled=false",
            "journalSyncData=false",
            "dbStorage_writeCacheMaxSizeMb=32",
            "dbStorage_readAheadCacheMaxSizeMb=32",
            "dbStorage_rocksDB_blockCacheSize=16777216",
        ]
        if self.secret_key:
            lines += [
                "authenticationEnabled=true",
                "authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
                f"tokenSecretKey=file://{self.broker_dir / 'secret.key'}",
                "authorizationEnabled=true",
                f"superUserRoles={ADMIN_ROLE}",
                "brokerClientAuthenticationPlugin=org.apache.pulsar.client.impl.auth.AuthenticationToken",
                f"brokerClientAuthenticationParameters=token:{self.token()}",
            ]
        else:
            lines += ["authenticationEnabled=false", "authorizationEnabled=false"]
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 180.0) -> "ApacheBroker":
        lib = find_jars()
        java = find_java()
        self.broker_port = self.broker_port or find_free_port()
        self.web_port = self.web_port or find_free_port()
        self.bookie_port = self.bookie_port or find_free_port()
        config = self.broker_dir / "standalone.conf"
        try:
            self.broker_dir.mkdir(parents=True, exist_ok=True)
            if self.secret_key:
                (self.broker_dir / "secret.key").write_bytes(self.secret_key)
            config.write_text(self.config_text())
            (self.broker_dir / "log4j2.xml").write_text(LOG4J2)
            log = open(self.log_file, "ab")
        except OSError as exc:
            raise BrokerError(f"cannot write the broker's files under {str(self.broker_dir)!r} "
                              f"({exc.strerror or exc}); set paths.data_dir to a writable folder") from exc
        command = [java, *self.jvm_options, *JAVA_OPENS,
                   f"-Dlog4j.configurationFile={self.broker_dir / 'log4j2.xml'}",
                   "-cp", f"{lib}/*", MAIN_CLASS, "--config", str(config),
                   "--no-functions-worker", "--no-stream-storage",
                   "--metadata-dir", str(self.broker_dir / "metadata"),
                   "--bookkeeper-dir", str(self.broker_dir / "bookkeeper"),
                   "--bookkeeper-port", str(self.bookie_port)]
        try:
            # cwd: the standalone looks for data/standalone/zookeeper there and would use ZooKeeper
            self.process = subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                            cwd=str(self.broker_dir), preexec_fn=die_with_parent)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.process.poll() is not None:
                raise BrokerError(f"Apache Pulsar exited with code {self.process.returncode} on "
                                  f"127.0.0.1:{self.broker_port}; see {str(self.log_file)!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"Apache Pulsar did not serve public/default on {self.admin_url} within "
                                  f"{timeout:.0f}s; see {str(self.log_file)!r}")
            time.sleep(0.5)
        self.endpoint_file.write_text(json.dumps({"service_url": self.service_url, "admin_url": self.admin_url,
                                                  "pid": self.process.pid}))
        return self

    def _ready(self) -> bool:
        """The broker port accepts connections and the admin API lists public/default (the
        standalone creates it after the broker started)."""
        if not port_is_open("127.0.0.1", self.broker_port):
            return False
        token = self.token()
        request = urllib.request.Request(f"{self.admin_url}/admin/v2/namespaces/public",
                                         headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return "public/default" in json.loads(response.read())
        except (OSError, ValueError):
            return False

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:
            if self.process is not None and json.loads(self.endpoint_file.read_text()).get("pid") == self.process.pid:
                self.endpoint_file.unlink()
        except (OSError, ValueError):
            pass

    def kill(self) -> None:
        """SIGKILL, as a crash would: no ledger is closed; the next start recovers them."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> "ApacheBroker":
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(settings) -> None:
    """``python -m pipeline broker --apache``: Apache Pulsar in the foreground until Ctrl-C, with
    the topics set up through its admin API (partitions, changelog retention)."""
    from pipeline.feed.topics import ensure_topics

    fetch_jars(quiet=False)
    broker = ApacheBroker(settings.data_dir)
    print(f"starting Apache Pulsar {PULSAR_VERSION} (about 30 s; log: {broker.log_file})", file=sys.stderr, flush=True)
    with broker:
        ensure_topics(settings.with_overrides(pulsar__service_url=broker.service_url, pulsar__admin_url=broker.admin_url))
        print(f"{broker.service_url} {broker.admin_url}", flush=True)
        print(f"use: --set pulsar.service_url={broker.service_url} --set pulsar.admin_url={broker.admin_url}",
              file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            while broker.process.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        if broker.process.poll() not in (None, 0, -signal.SIGTERM, 128 + signal.SIGTERM):
            raise BrokerError(f"Apache Pulsar stopped with code {broker.process.returncode}; see {str(broker.log_file)!r}")


if __name__ == "__main__":
    if sys.argv[1:] != ["fetch"]:
        sys.exit("usage: python -m pipeline.feed.apache_broker fetch")
    try:
        print(fetch_jars())
    except BrokerError as exc:
        sys.exit(f"error: {exc}")
