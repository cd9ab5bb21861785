"""A crash in the middle of an action: run it in a forked child that SIGKILLs itself just before
its N-th call of chosen functions (the file system steps of a savepoint or a restore).

delta-rs (the sinks' Delta tables) cannot run in a child forked from a process that already
used it (its tokio runtime panics), and the test process reads the sinks. So the children are
forked from a *zygote*: a process forked when this module is imported (at collection, before
any test touched a Delta table), which receives each action pickled (cloudpickle, bundled
with PySpark) and forks the child from its own clean state. The action is a closure of
picklable values (the test module's own functions go by value: the zygote imported it only
half-way); the child sees the other modules as they were imported, not the test's monkeypatches.
"""

from __future__ import annotations

import atexit
import os
import pickle
import shutil
import signal
import sys
import traceback
from typing import Callable

from pyspark import cloudpickle

# (owner, attribute[, stand-in]): the calls counted as steps; a stand-in replaces the real one.
FILE_STEPS = ((shutil, "copy2"), (shutil, "rmtree"), (os, "rename"), (os, "replace"))


def _run_child(payload: bytes) -> None:
    """In the forked child: count the steps, SIGKILL at the chosen one; never returns."""
    try:
        action, step, steps = pickle.loads(payload)
        count = [0]

        def counted(real):
            def step_then(*args, **kwargs):
                count[0] += 1
                if count[0] == step:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*args, **kwargs)
            return step_then

        for owner, name, *stand_in in steps:
            setattr(owner, name, counted(stand_in[0] if stand_in else getattr(owner, name)))
        action()
        os._exit(0)
    except BaseException:
        traceback.print_exc()  # shows in the failing test's captured output
        sys.stderr.flush()
        os._exit(3)


def _serve(requests, replies) -> None:
    """The zygote's loop: one pickled action in, one forked child run, its wait status out."""
    while True:
        header = requests.read(8)
        if len(header) < 8:
            return
        payload = requests.read(int.from_bytes(header, "big"))
        pid = os.fork()
        if pid == 0:
            _run_child(payload)
        _, status = os.waitpid(pid, 0)
        replies.write(status.to_bytes(8, "big"))
        replies.flush()


def _start_zygote():
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(request_write)
            os.close(reply_read)
            _serve(os.fdopen(request_read, "rb"), os.fdopen(reply_write, "wb"))
        finally:
            os._exit(0)
    os.close(request_read)
    os.close(reply_write)
    requests, replies = os.fdopen(request_write, "wb"), os.fdopen(reply_read, "rb")

    def stop() -> None:
        requests.close()
        os.waitpid(pid, 0)

    atexit.register(stop)
    return requests, replies


_ZYGOTE = _start_zygote()
_BY_REFERENCE = {"builtins", "__main__"}


def killed_at_step(action: Callable[[], object], step: int, steps=FILE_STEPS) -> bool:
    """True if the child died at ``step``; False if ``action`` finished first. A child that
    fails in any other way fails the test."""
    requests, replies = _ZYGOTE
    module = sys.modules.get(getattr(action, "__module__", ""))
    if module is not None and module.__name__ not in _BY_REFERENCE:
        cloudpickle.register_pickle_by_value(module)  # the zygote imported the test module only half-way
    payload = cloudpickle.dumps((action, step, steps))
    requests.write(len(payload).to_bytes(8, "big") + payload)
    requests.flush()
    status = int.from_bytes(replies.read(8), "big")
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, "the action failed instead of being killed"
    return False
