"""The job lock: one job (or restore) per data dir, released by the OS when its holder dies.

It is an ``flock`` on ``<data_dir>/job.lock``, held by the running job and by a restore, so a
second job on the same data dir refuses to start and a restore never runs under a live job,
however the holder ended (``kill -9`` included). :func:`file_lock` is the same kind of lock for
shorter critical sections (savepoint takes, replay numbering, the embedded broker).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from pathlib import Path

from pipeline import store
from pipeline.config import Settings
from pipeline.errors import ControlError


class JobLock:
    """An exclusive ``flock`` on ``<data_dir>/job.lock``; release it, or let the process end."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the lock
            self.fd = None

    def __enter__(self) -> "JobLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# A probe (job_is_running) holds the lock shared for microseconds; a taker retries this long
# before it concludes that a job or restore holds it.
PROBE_GRACE_S = 1.0


def acquire_job_lock(settings: Settings, holder: str = "job") -> JobLock:
    """Take the data dir's job lock; a ControlError if a job or restore holds it.

    It does not wait for a holder, only out :data:`PROBE_GRACE_S` of probes: a job or restore
    holds the lock for its whole run, a :func:`job_is_running` probe for a few microseconds.
    """
    data_dir = store.ensure_data_dir(settings.data_dir)
    path = store.job_lock_path(data_dir)
    try:
        fd = take_named_lock(path, 0o644, PROBE_GRACE_S, holder)
    except LockHeld as held:
        raise ControlError(f"a job already runs on data dir {str(data_dir)!r} (lock {str(path)!r} held by "
                           f"{held.owner}); stop it first or use another data dir") from None
    except OSError as exc:
        raise ControlError(f"cannot lock {str(path)!r}: {exc.strerror or exc}") from exc
    return JobLock(fd, path)


class LockHeld(Exception):
    """Another process holds the lock; ``owner`` is what it wrote in the file."""

    def __init__(self, owner: str):
        super().__init__(owner)
        self.owner = owner


def take_named_lock(path: Path, mode: int, grace_s: float | None, holder: str | None = None) -> int:
    """An exclusive ``flock`` on ``path`` (created with ``mode``), waiting ``grace_s`` for it, with
    ``pid N (holder)`` written in the file for whoever finds it taken: the descriptor (close it to
    release). LockHeld when another holds it; OSError when the file cannot be opened or locked."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
    try:
        _flock_within(fd, fcntl.LOCK_EX, grace_s)
    except OSError as exc:
        try:
            owner = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise LockHeld(owner) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}{f' ({holder})' if holder else ''}\n".encode(), 0)
    return fd


def job_is_running(settings: Settings) -> bool:
    """Whether a job (or a restore) holds this data dir's job lock right now."""
    try:
        fd = os.open(store.job_lock_path(settings.data_dir), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock, if taken


def _flock_within(fd: int, operation: int, timeout_s: float | None) -> None:
    """``flock(fd, operation)``, retried every 5 ms for ``timeout_s`` (None: wait as long as it takes)."""
    if timeout_s is None:
        fcntl.flock(fd, operation)
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() >= deadline:
                raise
        time.sleep(0.005)


@contextlib.contextmanager
def file_lock(path: Path, shared: bool = False, timeout_s: float | None = None):
    """Hold an ``flock`` on ``path`` (created 0600) for the ``with`` block; the OS drops it if we die.

    Waits ``timeout_s`` seconds for it (None: as long as it takes), then raises BlockingIOError.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        _flock_within(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, timeout_s)
        yield fd
    finally:
        os.close(fd)
