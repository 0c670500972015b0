"""Between two students' jobs in one sandbox: nothing of the first may be left for the second.

The zygote (worker.py) runs no submitted code; every task ran in a child it forked. What a task could leave behind
in the sandbox once every process of it is gone: files in the sandbox's tmpfs (``/tmp``, its working folder, and
``/dev/shm``), SysV shared memory, semaphores and message queues (they live in the sandbox's IPC namespace, not in
a process). POSIX message queues cannot be made at all (the zygote sets ``RLIMIT_MSGQUEUE`` to 0), nor keys
(``keyrings.py``). Sockets, pipes, locks, watches and abstract unix sockets end with their processes. What
bubblewrap mounted there (the read-only trees of a course or environment checked out under /tmp) stays, with the
folders that lead to it, emptied of anything else.

Under the grader's own uid (one identity) a task can also write bubblewrap's own ``/`` and ``/dev`` (tmpfs of that
uid): plant files there, replace a symlink, chmod or set extended attributes (ACLs) on what bubblewrap made. The
zygote takes a ``Baseline`` of them before any task runs, and the sweep puts them back as they were: what is not in
it is removed, modes, attributes, symlinks and times are restored, and the result must equal the baseline
(times left out: set back, not checked). The same
baseline holds the zygote's own rlimits, nice value, scheduler and CPU affinity, which a task of the same uid can
change from outside (prlimit, setpriority, sched_setaffinity).

``fresh_for_next_job`` does it all and checks the result; on any doubt it answers False and the zygote exits, so
the grader starts a fresh sandbox instead.
"""
import ctypes
import hashlib
import os
import resource
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

IPC_RMID = 0
SETTLE_S = 5.0  # how long the sandbox's last processes may take to go away
FOLDERS = ("/tmp", "/dev/shm")
_libc = ctypes.CDLL(None, use_errno=True)


# Not walked by the baseline: emptied instead (FOLDERS, the working folder), or with nothing a process leaves there
# (/proc, /sys; /dev/pts, whose terminals end with their descriptors).
NOT_WALKED = ("/proc", "/sys", "/dev/pts")
RLIMITS = sorted({getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")})


@dataclass(frozen=True)
class Baseline:
    """What bubblewrap made in the sandbox's writable file systems outside the emptied folders (path -> how it is),
    and the zygote's own process settings, as they were before any task ran."""
    entries: dict
    process: tuple
    skipped: tuple[str, ...]


def baseline(folders: tuple[str, ...] = FOLDERS) -> Baseline:
    """Take it in the zygote, before any submitted code exists."""
    skipped = tuple({*folders, os.getcwd(), *NOT_WALKED})
    return Baseline(_entries(_mount_points(), skipped), _process_settings(), skipped)


def fresh_for_next_job(folders: tuple[str, ...] = FOLDERS, before: Baseline | None = None) -> bool:
    """Kill every other process of this PID namespace, wait until they are gone, then empty ``folders`` (and the
    working folder), remove every SysV IPC object, and put what ``before`` holds back as it was. True only when all
    of it is verified done. Call only as the sandbox's zygote (its own PID, IPC and mount namespaces): it kills and
    removes everything it can reach."""
    try:
        os.kill(-1, signal.SIGKILL)  # everything but ourselves and the namespace's init (bubblewrap, or ourselves)
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
        if before is not None:
            _restore(before, mounts)
            _restore_process_settings(before.process)
            if _entries(mounts, before.skipped, times=False) != _without_times(before.entries) or \
                    _process_settings() != before.process:
                return False
        return not any(_left(folder, mounts) for folder in folders) and not _sysv_ids()
    except (OSError, RecursionError, ValueError):  # something it cannot undo: the next student gets a fresh sandbox
        return False


def _under(path: str, folders: tuple[str, ...]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def _describe(path: str, mounts: set[str], times: bool = True) -> tuple:
    """How one entry is: type and mode, owner, symlink target, extended attributes (ACLs included), the content of a
    plain file that is not a mount point, and (``times``) its access and modification times."""
    info = os.lstat(path)
    target = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
    try:
        xattrs = tuple(sorted((name, os.getxattr(path, name, follow_symlinks=False))
                              for name in os.listxattr(path, follow_symlinks=False)))
    except OSError:  # a file system without extended attributes, or a symlink's (none can be set there)
        xattrs = ()
    content = None
    if stat.S_ISREG(info.st_mode) and path not in mounts:
        try:
            with open(path, "rb") as f:
                content = hashlib.sha256(f.read(1 << 20)).hexdigest()
        except PermissionError:  # not ours to read (nor then to have written)
            content = "unreadable"
    return (info.st_mode, info.st_uid, info.st_gid, target, xattrs, content,
            (info.st_atime_ns, info.st_mtime_ns) if times else None)


def _walked(path: str, mounts: set[str], skipped: tuple[str, ...]) -> bool:
    """A folder whose entries the baseline holds: on a writable file system, and not one of the emptied folders."""
    if _under(path, skipped):
        return False
    return not os.statvfs(path).f_flag & os.ST_RDONLY


def _entries(mounts: set[str], skipped: tuple[str, ...], times: bool = True) -> dict:
    """Every entry of every walked folder from / down (not into read-only mounts or the skipped folders)."""
    found, pending = {"/": _describe("/", mounts, times)}, ["/"]
    while pending:
        folder = pending.pop()
        if not _walked(folder, mounts, skipped):
            continue
        for entry in _listed(folder):
            found[entry.path] = _describe(entry.path, mounts, times)
            if entry.is_dir(follow_symlinks=False):
                pending.append(entry.path)
    return found


def _listed(folder: str) -> list:
    try:
        return list(os.scandir(folder))
    except PermissionError:  # root's, seen from a uid of its own: nor then a folder a task could write in
        return []


def _without_times(entries: dict) -> dict:
    return {path: (*how[:-1], None) for path, how in entries.items()}


def _restore(before: Baseline, mounts: set[str]) -> None:
    """Put the walked folders back as ``before``: modes first (a task may have left one without permissions), then
    remove what is new or of another kind, make again the symlinks and folders that went, restore attributes and times."""
    for path in sorted(before.entries):  # parents first
        mode, uid, gid, target, xattrs, content, times = before.entries[path]
        try:
            now = os.lstat(path)
        except FileNotFoundError:
            now = None
        if now is not None and stat.S_IFMT(now.st_mode) != stat.S_IFMT(mode):
            _remove(path, mounts)
            now = None
        if now is None:
            if stat.S_ISLNK(mode):
                os.symlink(target, path)
            elif stat.S_ISDIR(mode):
                os.mkdir(path)
            else:
                continue  # it cannot be made again: the check after the sweep fails
        if stat.S_ISLNK(mode):
            if os.readlink(path) != target:
                os.unlink(path)
                os.symlink(target, path)
            continue
        if stat.S_IMODE(os.lstat(path).st_mode) != stat.S_IMODE(mode):
            os.chmod(path, stat.S_IMODE(mode))
        if stat.S_ISDIR(mode) and _walked(path, mounts, before.skipped):
            for entry in _listed(path):
                if entry.path not in before.entries:
                    _remove(entry.path, mounts)
        _restore_xattrs(path, dict(xattrs))
    me = os.getuid()
    for path, how in sorted(before.entries.items(), reverse=True):  # children first: a folder's times last
        now = os.lstat(path)
        if how[1] == me and not stat.S_ISLNK(how[0]) and (now.st_atime_ns, now.st_mtime_ns) != how[-1]:
            try:  # only the times of what this uid owns can have been set; a read-only mount keeps its own
                os.utime(path, ns=how[-1], follow_symlinks=False)
            except OSError:
                pass


def _restore_xattrs(path: str, wanted: dict) -> None:
    try:
        now = set(os.listxattr(path, follow_symlinks=False))
    except OSError:
        return
    for name in now - set(wanted):
        os.removexattr(path, name, follow_symlinks=False)
    for name, value in wanted.items():
        if name not in now or os.getxattr(path, name, follow_symlinks=False) != value:
            os.setxattr(path, name, value, follow_symlinks=False)


def _process_settings() -> tuple:
    """What a task of the same uid can change in the zygote from outside: its rlimits (prlimit), nice value
    (setpriority), scheduling policy and CPU affinity (sched_setscheduler, sched_setaffinity)."""
    return (tuple(resource.getrlimit(r) for r in RLIMITS), os.getpriority(os.PRIO_PROCESS, 0),
            os.sched_getscheduler(0), tuple(sorted(os.sched_getaffinity(0))))


def _restore_process_settings(settings: tuple) -> None:
    """Raise back what can be raised (soft rlimits, affinity); a lowered hard limit or a higher nice value stays, and
    the check that follows refuses the sandbox."""
    limits, _, _, cpus = settings
    for r, (soft, hard) in zip(RLIMITS, limits):
        if resource.getrlimit(r) != (soft, hard) and resource.getrlimit(r)[1] == hard:
            resource.setrlimit(r, (soft, hard))
    if tuple(sorted(os.sched_getaffinity(0))) != cpus:
        os.sched_setaffinity(0, cpus)


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
