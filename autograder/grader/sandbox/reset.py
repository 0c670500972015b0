"""Between two students' jobs in one sandbox: nothing of the first may be left for the second.

The zygote (worker.py) runs no submitted code; every task ran in a child it forked. What a task could leave behind
in the sandbox once every process of it is gone: files in the sandbox's tmpfs (``/tmp``, its working folder, and
``/dev/shm``), SysV shared memory, semaphores and message queues (they live in the sandbox's IPC namespace, not in
a process). POSIX message queues cannot be made at all (the zygote sets ``RLIMIT_MSGQUEUE`` to 0). Sockets, pipes,
locks, watches and abstract unix sockets end with their processes. What bubblewrap mounted there (the read-only
trees of a course or environment checked out under /tmp) stays, with the folders that lead to it, emptied of
anything else.

``fresh_for_next_job`` does it all and checks the result; on any doubt it answers False and the zygote exits, so
the grader starts a fresh sandbox instead.
"""
import ctypes
import os
import signal
import stat
import time
from pathlib import Path

IPC_RMID = 0
SETTLE_S = 5.0  # how long the sandbox's last processes may take to go away
FOLDERS = ("/tmp", "/dev/shm")
_libc = ctypes.CDLL(None, use_errno=True)


def fresh_for_next_job(folders: tuple[str, ...] = FOLDERS) -> bool:
    """Kill every other process of this PID namespace, wait until they are gone, then empty ``folders`` (and the
    working folder) and remove every SysV IPC object. True only when all of it is verified done. Call only as the
    sandbox's zygote (its own PID, IPC and mount namespaces): it kills and removes everything it can reach."""
    try:
        os.kill(-1, signal.SIGKILL)  # everything but ourselves and the namespace's init (bubblewrap)
    except ProcessLookupError:
        pass
    if not _others_gone(time.monotonic() + SETTLE_S):
        return False
    folders = tuple({*folders, os.getcwd()})
    try:
        mounts = _mount_points()
        for folder in folders:
            _empty(folder, mounts)
        _remove_sysv_ipc()
        return not any(_left(folder, mounts) for folder in folders) and not _sysv_ids()
    except (OSError, RecursionError):  # something it cannot remove: the next student gets a fresh sandbox
        return False


def _others_gone(deadline: float) -> bool:
    """True once no process but init and this one is left in our PID namespace (our own children reaped)."""
    me = os.getpid()
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        if not [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _mount_points() -> set[str]:
    """Every mount point this process sees (``/proc/self/mountinfo``'s fifth field, octal escapes undone)."""
    points = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        points.add(point.encode().decode("unicode_escape").encode("latin-1").decode(errors="surrogateescape"))
    return points


def _leads_to_mount(path: str, mounts: set[str]) -> bool:
    return path in mounts or any(m.startswith(path + "/") for m in mounts)


def _empty(folder: str, mounts: set[str]) -> None:
    """Remove everything in ``folder`` but mounts and the folders leading to them (a task may have left folders
    without permissions: given them back first)."""
    for entry in os.scandir(folder):
        _remove(entry.path, mounts)


def _remove(path: str, mounts: set[str]) -> None:
    if path in mounts:
        return
    if os.path.isdir(path) and not os.path.islink(path):
        kept = _leads_to_mount(path, mounts)  # bubblewrap made it (as root, for a root grader): it stays
        try:
            os.chmod(path, stat.S_IRWXU | (0o055 if kept else 0))
        except PermissionError:
            if not kept:
                raise
        for entry in os.scandir(path):
            _remove(entry.path, mounts)
        if not kept:
            os.rmdir(path)
    else:
        os.unlink(path)


def _left(folder: str, mounts: set[str]) -> list[str]:
    """What is still in ``folder`` besides mounts and the folders leading to them."""
    left = []
    for entry in os.scandir(folder):
        if entry.path in mounts:
            continue
        if entry.is_dir(follow_symlinks=False) and _leads_to_mount(entry.path, mounts):
            left += _left(entry.path, mounts)
        else:
            left.append(entry.path)
    return left


def _sysv_ids() -> list[tuple[str, int]]:
    """Every SysV IPC object of this IPC namespace: (kind, id), from /proc/sysvipc (second column)."""
    found = []
    for kind in ("shm", "sem", "msg"):
        try:
            lines = Path("/proc/sysvipc", kind).read_text().splitlines()[1:]
        except OSError:
            continue
        found += [(kind, int(line.split()[1])) for line in lines if line.strip()]
    return found


def _remove_sysv_ipc() -> None:
    remove = {"shm": lambda i: _libc.shmctl(i, IPC_RMID, None), "sem": lambda i: _libc.semctl(i, 0, IPC_RMID),
              "msg": lambda i: _libc.msgctl(i, IPC_RMID, None)}
    for kind, ident in _sysv_ids():
        remove[kind](ident)
