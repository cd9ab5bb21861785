"""A crash in the middle of an action: run it in a forked child that SIGKILLs itself just before
its N-th call of chosen functions (the file system steps of a savepoint or a restore)."""

from __future__ import annotations

import os
import shutil
import signal
from typing import Callable

# (owner, attribute[, stand-in]): the calls counted as steps; a stand-in replaces the real one.
FILE_STEPS = ((shutil, "copy2"), (shutil, "rmtree"), (os, "rename"), (os, "replace"))


def killed_at_step(action: Callable[[], object], step: int, steps=FILE_STEPS) -> bool:
    """True if the child died at ``step``; False if ``action`` finished first. A child that
    fails in any other way fails the test."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
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
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WEXITSTATUS(status) == 0, "the action failed instead of being killed"
    return False
