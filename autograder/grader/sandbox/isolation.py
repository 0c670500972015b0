"""Per-rank isolation in class grading: a rank can reach its siblings only through the loopback, and cannot stop
the process that measures it.

The grader counts the bytes ranks send each other on the sandbox's loopback and samples their memory from the
launching process (exercises/beside/meter.py). Inside one sandbox, ranks of the same uid could otherwise move data past
those counters (a file in /tmp or /dev/shm, a unix socket, SysV memory, another rank's memory through
``process_vm_readv`` or ``/proc/<pid>/mem``, a pty, the shared output file reopened through ``/proc/self/fd``), or
SIGSTOP the launcher around their peak. So every rank, before any submitted code runs (``ranks.configure``'s
``child_setup``, registered by the grading worker only), gets:

* its own output file (the worker shows them all as the task's output), and no other descriptor than that and its
  own pipes (``close_inherited``), so no file is open in two ranks;
* its own user, mount and IPC namespaces (the same uid mapped: no newuidmap needed), where no further user
  namespace can be made (so no uncounted mount of its own);
* every tmpfs the sandbox has read-only, and a fresh private tmpfs on /tmp and /dev/shm (its working folder),
  whose usage the launcher adds to the rank's memory (rank_holdings.py); no ptys (an empty /dev/pts);
* no capabilities, ``no_new_privs``, and a Landlock domain of its own: no ptrace of a process outside it (ABI 1),
  and, with ABI >= 6 (Linux 6.12), no abstract unix socket and no signal outside it.

What a kernel cannot give is said once in the grader's warning (``describe``), from ``probe.py``'s run of
``available()`` in a worker exactly like a student's.
"""
import ctypes
import errno
import os
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWIPC = 0x20000, 0x10000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
LOCKED_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
                "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 4, 24, 38, 47, 4
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_RESTRICT_SELF = 444, 446  # the same number on every architecture
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_ACCESS_FS_MAKE_CHAR, LANDLOCK_ACCESS_FS_MAKE_BLOCK = 1 << 6, 1 << 11  # never needed: a domain's cheap key
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET, LANDLOCK_SCOPE_SIGNAL = 1, 2
SCOPES_ABI = 6
RANK_OUTPUT = "rank-output-{pid}.txt"     # in the worker's folder, one per rank

_libc = ctypes.CDLL(None, use_errno=True)


class IsolationFailed(OSError):
    """A step of the isolation failed: the rank must not run submitted code."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


def _check(result: int, what: str) -> None:
    if result < 0:
        code = ctypes.get_errno()
        raise IsolationFailed(code, f"{what}: {os.strerror(code)}")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock."""
    abi = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(abi, 0)


def close_inherited(keep) -> None:
    """Close every descriptor but 1, 2 and ``keep``: one opened before the fork (the task's own output file, say) is
    open in every rank, and reopened through ``/proc/self/fd`` it would be a file they all share."""
    low = 0
    for fd in sorted({1, 2, *keep}):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(low, os.sysconf("SC_OPEN_MAX")))


def isolate_rank(tmp_bytes: int, keep_fds=(), scopes: bool = True) -> None:
    """Run in a freshly forked rank (one thread) before any submitted code; raises IsolationFailed. ``keep_fds``: the
    rank's own descriptors; every other one it inherited is closed."""
    _own_output()
    close_inherited(keep_fds)
    uid, gid = os.getuid(), os.getgid()
    # The worker made itself non-dumpable, which makes /proc/self/* root's: the maps below could not be written.
    _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        _write(f"/proc/self/{name}", text)
    # A user namespace of its own would let submitted code mount a tmpfs that no meter sees.
    _write("/proc/sys/user/max_user_namespaces", "0")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    mounts = _mounts()
    for target, flags in _writable_tmpfs(mounts):
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    for target in ("/tmp", "/dev/shm"):
        _fresh_tmpfs(target, tmp_bytes, [m for m, _, _ in mounts])
    if os.path.isdir("/dev/pts"):
        _mount("tmpfs", "/dev/pts", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=755")
    os.chdir("/tmp")  # the old working folder (the worker's /tmp, shared) must not stay reachable as "."
    _drop_capabilities()
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    in_domain = _landlock(scopes and landlock_abi() >= SCOPES_ABI)
    # Dumpable, the launcher (same uid, outside any Landlock domain) can read this rank's private tmpfs usage through
    # /proc/<pid>/root (rank_holdings.py); the other ranks, each in a domain of its own, still cannot reach it. Without
    # Landlock they could, so the rank stays non-dumpable then.
    _check(_libc.prctl(PR_SET_DUMPABLE, 1 if in_domain else 0, 0, 0, 0), "dumpable")


def _own_output() -> None:
    """Print to a file of this rank's own: the task's output file, open in every rank, could be reopened for reading
    through /proc/self/fd/1 by one rank while another writes to it."""
    fd = os.open(RANK_OUTPUT.format(pid=os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise IsolationFailed(exc.errno or errno.EPERM, f"writing {path}: {exc.strerror}") from None


def _mount(source, target: str, fstype, flags: int, data: str | None = None) -> None:
    encode = (lambda s: None if s is None else s.encode())
    _check(_libc.mount(encode(source), target.encode(), encode(fstype), ctypes.c_ulong(flags), encode(data)),
           f"mount {target}")


def _fresh_tmpfs(target: str, size: int, mount_points: list[str]) -> None:
    """A new, empty tmpfs on ``target``, with what was mounted below it bound again (the grader's packages, when the
    course is checked out under /tmp): held by descriptors while the new tmpfs covers their paths."""
    below = [m for m in mount_points if m.startswith(target.rstrip("/") + "/")]
    below = [m for m in below if not any(m.startswith(o + "/") for o in below)]  # their own submounts come along
    held = [(m, os.open(m, os.O_PATH | os.O_CLOEXEC)) for m in below]
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    for path, fd in held:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "a").close()
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)


def _mounts() -> list[tuple[str, str, list[str]]]:
    """(mount point, file system type, per-mount options) of every mount in this namespace, in mount order."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields = before.split()
        found.append((fields[4].encode().decode("unicode_escape"), after.split()[0], fields[5].split(",")))
    return found


def _writable_tmpfs(mounts) -> list[tuple[str, int]]:
    """Every writable tmpfs in this mount namespace (bubblewrap's /, /dev and the folders it made are writable for an
    unprivileged grader's workers), with the flags a remount must keep (they are locked in a child namespace)."""
    return [(target, sum(LOCKED_FLAGS.get(o, 0) for o in options)) for target, fstype, options in mounts
            if fstype == "tmpfs" and "rw" in options and target not in ("/tmp", "/dev/shm")]


def _drop_capabilities() -> None:
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 and ctypes.get_errno() != errno.EINVAL:
            _check(-1, "dropping the bounding set")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)   # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()                  # effective, permitted, inheritable: all empty
    _check(_libc.capset(header, data), "capset")


def _landlock(scopes: bool) -> bool:
    """A Landlock domain of this rank's own. Being in one already denies ptrace of anything outside it; the scopes
    deny abstract unix sockets and signals outside it. Without Landlock the rank goes on (the warning says so)."""
    if landlock_abi() < 1:
        return False
    scoped = LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL if scopes else 0
    attr = _RulesetAttr(LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_BLOCK, 0, scoped)
    fd = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                       ctypes.c_uint32(0))
    _check(fd, "landlock_create_ruleset")
    try:
        _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, fd, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(fd)
    return True


def available(tmp_bytes: int = 1 << 20) -> dict:
    """What isolation this process's forked children get here: ``{"namespaces": "" or why not, "landlock_abi": n}``.
    Tried in a child (run in a worker exactly like a grading one: probe.py)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        problem = ""
        try:
            os.chdir(os.environ.get("TMPDIR", "/tmp"))
            isolate_rank(tmp_bytes, keep_fds=[write_fd])
        except Exception as exc:
            problem = str(exc) or type(exc).__name__
        finally:
            os.write(write_fd, problem.encode()[:500])
            os._exit(0)
    os.close(write_fd)
    problem = os.read(read_fd, 1000).decode(errors="replace")
    os.close(read_fd)
    os.waitpid(pid, 0)
    for leftover in Path(os.environ.get("TMPDIR", "/tmp")).glob(RANK_OUTPUT.format(pid=pid)):
        leftover.unlink()
    return {"namespaces": problem, "landlock_abi": landlock_abi()}


def describe(found: dict | None) -> str:
    """The warning for what rank isolation lacks here ("" when complete)."""
    if found is None:
        return ""
    if found.get("namespaces"):
        return (f"ranks are not isolated from each other ({found['namespaces']}): a student's ranks can exchange data "
                "outside the loopback the grader counts, and stop the process that measures their memory")
    abi = found.get("landlock_abi", 0)
    if abi < 1:
        return ("no Landlock in this kernel: a student's ranks can read each other's memory (ptrace), use abstract "
                "unix sockets and signal the process that measures them")
    if abi < SCOPES_ABI:
        return (f"Landlock ABI {abi} < {SCOPES_ABI} (Linux < 6.12): a student's ranks can use abstract unix sockets "
                "and signal the process that measures them")
    return ""


def rank_outputs(folder: str = ".") -> list[Path]:
    """The output files of the ranks a task started, oldest first."""
    def pid(path: Path) -> int:
        return int(path.stem.rsplit("-", 1)[-1]) if path.stem.rsplit("-", 1)[-1].isdigit() else 0

    return sorted(Path(folder).glob(RANK_OUTPUT.format(pid="*")), key=pid)
