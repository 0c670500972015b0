"""Processes a test leaves behind: make the test process the reaper of orphans, then list its children."""
import ctypes
import os
from pathlib import Path

import pytest

PR_SET_CHILD_SUBREAPER = 36


def descendants_left() -> list[int]:
    """Children of this process (orphaned grandchildren are re-parented here, see ``subreaper``)."""
    me, kids = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            kids.append(int(stat.parent.name))
    return kids


def reap_orphans() -> None:
    """Collect the exit status of orphans that ended after being re-parented to us (else they stay zombies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


@pytest.fixture
def subreaper():
    """Make this process the reaper of its orphans, so a leaked grandchild shows up as our child."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    assert descendants_left() == [], "processes were already running before the test"
    yield
    reap_orphans()
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
