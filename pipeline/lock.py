"""The job lock: one job (or restore) per data dir, released by the OS when its holder dies.

It is an ``flock`` on ``<data_dir>/job.lock``, held by the running job and by a restore, so a
second job on the same data dir refuses to start and a restore never runs under a live job,
however the holder ended (``kill -9`` included).
"""

from __future__ import annotations

import errno
import fcntl
import os
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


def acquire_job_lock(settings: Settings, holder: str = "job") -> JobLock:
    """Take the data dir's job lock without waiting; a ControlError if a job or restore holds it."""
    data_dir = store.ensure_data_dir(settings.data_dir)
    path = store.job_lock_path(data_dir)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ControlError(f"cannot open the job lock {str(path)!r}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        try:
            owner = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise ControlError(f"a job already runs on data dir {str(data_dir)!r} (lock {str(path)!r} held by "
                               f"{owner}); stop it first or use another data dir") from None
        raise ControlError(f"cannot lock {str(path)!r}: {exc.strerror or exc}") from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} ({holder})\n".encode(), 0)
    return JobLock(fd, path)


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
