"""The embedded pulsar-lite broker: our own launcher, and how every process finds a broker.

:class:`EmbeddedBroker` starts the ``pulsar-lite`` binary from the PyPI package on
127.0.0.1 and a free port, with a config file that turns its metrics endpoint off (it would
otherwise listen on all interfaces), data under ``<data_dir>/broker/``, and a parent-death
signal so it never outlives the process that started it. Its keeper keeps ``broker.log`` under
:data:`BROKER_LOG_MAX_BYTES` (:func:`cap_log`) and removes the subscriptions pulsar-lite keeps for
the source's closed readers (pipeline/feed/reader_sweep.py).

A running embedded broker writes ``<data_dir>/broker/endpoint.json``; :func:`resolve_service_url`
reads it so the producers, the job and the console all reach the same broker.

One broker per data dir: :class:`EmbeddedBroker` holds an exclusive ``flock`` on
``<data_dir>/broker/broker.lock`` from before pulsar-lite starts until it has exited (pulsar-lite
inherits the descriptor, so a killed starter cannot let a second one start on the same files).

The job, ``sql`` and ``broker`` share one broker through :func:`use_embedded_broker`: each holds a
shared ``flock`` on ``broker/users.lock`` while it uses the broker. The first one starts a
*keeper* (``keep_broker``), a process of its own session that owns pulsar-lite and stops it
once no process holds ``users.lock`` any more. So a pipeline never stops a broker that another
process uses, and the broker never outlives its last user.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import Settings
from pipeline.errors import BrokerError
from pipeline.feed.ports import find_free_port
from pipeline.feed.reader_sweep import ReaderSweep

_PR_SET_PDEATHSIG = 1
BROKER_LOCK, USERS_LOCK, START_LOCK = "broker.lock", "users.lock", "start.lock"
BROKER_CONFIG = """\
# Written by pipeline/feed/broker.py. Metrics are off: pulsar-lite would bind 0.0.0.0:8080 otherwise.
[metrics]
enabled = false
"""


# pulsar-lite 0.2.0 never removes a reader's subscription: a closed reader (CloseConsumer) leaves
# it on its topic (only an Unsubscribe removes one), and after every entry published it tries
# each subscription of the topic in turn, logging "No dispatcher found for subscription …" for
# each one without a consumer (Topic::dispatch_to_subscriptions, PersistentSubscription::
# dispatch_messages). The source opens a reader per range per batch, so the log grew by the
# entries published times the readers closed so far: faster every minute, 19.9 GB in the hour's
# benchmark (bench/README.md, issue 28). Its other warnings stay on; env_logger's module filter
# (RUST_LOG) is more specific than ``--log-level``.
BROKER_RUST_LOG = "pulsar_lite::broker::service::persistent::persistent_subscription=error"


def broker_environment(base: dict[str, str] | None = None, rust_log: str = BROKER_RUST_LOG) -> dict[str, str]:
    """pulsar-lite's environment: ours (or ``base``) with ``rust_log`` added to RUST_LOG."""
    env = dict(os.environ if base is None else base)
    env["RUST_LOG"] = ",".join(filter(None, (env.get("RUST_LOG"), rust_log)))
    return env


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
    lock_fd: int | None = None
    rust_log: str = BROKER_RUST_LOG  # a test turns the closed readers' warnings back on with ""

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
        except OSError as exc:
            raise BrokerError(f"cannot write the broker's files under {str(self.broker_dir)!r} "
                              f"({exc.strerror or exc}); set paths.data_dir to a writable folder") from exc
        self._lock()
        try:
            return self._start(binary, config, timeout)
        except BaseException:
            self.stop()
            raise

    def _lock(self) -> None:
        """Take ``broker.lock`` without waiting: a BrokerError if a broker runs on these files."""
        from pipeline.control.lock import LockHeld, take_named_lock

        path = self.broker_dir / BROKER_LOCK
        try:
            self.lock_fd = take_named_lock(path, 0o600, 0.0)
        except LockHeld as held:
            raise BrokerError(f"an embedded broker already runs on {str(self.broker_dir)!r} (lock {str(path)!r} "
                              f"held by {held.owner}); use it, or stop it first") from None
        except OSError as exc:
            raise BrokerError(f"cannot lock {str(path)!r}: {exc.strerror or exc}") from exc

    def _start(self, binary: Path, config: Path, timeout: float) -> "EmbeddedBroker":
        try:
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
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=broker_environment(rust_log=self.rust_log),
                cwd=str(self.broker_dir), preexec_fn=die_with_parent,
                pass_fds=(self.lock_fd,),  # the lock lasts until pulsar-lite itself has exited
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
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # pulsar-lite's copy went with it
            self.lock_fd = None

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


class BrokerUse:
    """This process's use of the data dir's embedded broker: a shared ``flock`` on ``users.lock``.

    ``stop()`` (or the process's end) drops it; the keeper stops the broker once no use is left.
    """

    def __init__(self, fd: int, service_url: str):
        self.fd, self.service_url = fd, service_url

    def stop(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "BrokerUse":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def use_embedded_broker(data_dir: Path, timeout: float = 30.0) -> BrokerUse:
    """Use the data dir's embedded broker, starting a keeper for it if none runs.

    Called by the job, ``sql`` and ``broker``. Starts are serialised by ``start.lock``, so two
    processes starting at once get one broker. Waits ``timeout`` seconds at most.
    """
    from pipeline.control.lock import file_lock

    broker_dir = Path(data_dir) / "broker"
    try:
        broker_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(broker_dir / USERS_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise BrokerError(f"cannot write the broker's files under {str(broker_dir)!r} "
                          f"({exc.strerror or exc}); set paths.data_dir to a writable folder") from exc
    try:
        deadline = time.monotonic() + timeout
        while True:  # a keeper stopping its broker holds users.lock exclusively until it is gone
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BrokerError(f"the embedded broker of {str(data_dir)!r} did not finish stopping "
                                      f"within {timeout:.0f}s") from None
                time.sleep(0.05)
        try:
            with file_lock(broker_dir / START_LOCK, timeout_s=timeout):
                url = running_embedded_url(data_dir) or _start_keeper(Path(data_dir), deadline)
        except BlockingIOError:
            raise BrokerError(f"another process kept starting the embedded broker of {str(data_dir)!r} "
                              f"for {timeout:.0f}s; see {str(broker_dir / 'keeper.log')!r}") from None
        return BrokerUse(fd, url)
    except BaseException:
        os.close(fd)
        raise


def _start_keeper(data_dir: Path, deadline: float) -> str:
    """Start ``keep_broker`` in a session of its own (a Ctrl-C or a kill of our group spares it)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    log_path = data_dir / "broker" / "keeper.log"
    with open(log_path, "ab") as log:
        keeper = subprocess.Popen(
            [sys.executable, "-c", "import sys; from pipeline.feed.broker import keep_broker; sys.exit(keep_broker(sys.argv[1]))",
             str(data_dir)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, cwd=str(root), start_new_session=True)
    while (url := running_embedded_url(data_dir)) is None:
        if keeper.poll() is not None:
            raise BrokerError(f"the embedded broker's keeper exited with code {keeper.returncode}; "
                              f"see {str(log_path)!r}")
        if time.monotonic() > deadline:
            keeper.terminate()
            raise BrokerError(f"the embedded broker did not start within the time allowed; see {str(log_path)!r}")
        time.sleep(0.05)
    return url


# The log of a broker the keeper runs is bounded as well as silenced (BROKER_RUST_LOG): past this
# size, the keeper moves it aside (one file kept). Its data cannot be bounded (it deletes no
# message, README "Retention").
BROKER_LOG_MAX_BYTES = 64 << 20


def cap_log(path: Path, max_bytes: int = BROKER_LOG_MAX_BYTES) -> bool:
    """Keep the log at ``path`` under about ``max_bytes``: past it, its content is copied to
    ``<path>.1`` (replacing the one before) and it starts again empty. Its writer opened it with
    O_APPEND (:meth:`EmbeddedBroker._start`), so it writes on at the new end (copytruncate;
    lines written between the copy and the truncation are lost). True if it was moved aside."""
    try:
        if path.stat().st_size <= max_bytes:
            return False
        shutil.copyfile(path, path.with_name(path.name + ".1"))
        os.truncate(path, 0)
        return True
    except OSError:  # gone or unwritable: the next poll tries again
        return False


def keep_broker(data_dir: str | Path, poll_s: float = 0.25) -> int:
    """The keeper's process: run pulsar-lite for ``data_dir`` until no process uses it (or SIGTERM).

    It takes ``users.lock`` exclusively, which succeeds only once no user holds it shared, and
    stops pulsar-lite still holding it, so a new user waits for the stop and then starts afresh.
    """
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    broker = EmbeddedBroker(Path(data_dir))
    try:
        broker.start()
    except BrokerError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    users = os.open(broker.broker_dir / USERS_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    readers = ReaderSweep(broker.broker_dir)
    try:
        while not stopping and broker.process.poll() is None:
            try:
                fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break  # the last user is gone
            except BlockingIOError:
                cap_log(broker.broker_dir / "broker.log")
                readers.maybe_sweep(broker.service_url)
                time.sleep(poll_s)
        broker.stop()
    finally:
        os.close(users)
    code = broker.process.returncode
    return 0 if code in (0, -signal.SIGTERM) else 1


def serve_forever(settings: Settings) -> None:
    """``python -m pipeline broker``: use (start) the embedded broker in the foreground until Ctrl-C.

    On Ctrl-C it stops using the broker: the broker stops then unless a job or pipeline still uses it.
    """
    existing = running_embedded_url(settings.data_dir)
    if existing:
        raise BrokerError(f"an embedded broker already runs for this data dir at {existing}")
    with use_embedded_broker(settings.data_dir) as use:
        from pipeline.feed.topics import ensure_topics

        ensure_topics(settings.with_overrides(pulsar__service_url=use.service_url))
        print(use.service_url, flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            while running_embedded_url(settings.data_dir) == use.service_url:
                time.sleep(0.5)
        except KeyboardInterrupt:
            return
        raise BrokerError(f"the embedded broker at {use.service_url} stopped; see "
                          f"{str(Path(settings.data_dir) / 'broker' / 'broker.log')!r}")
