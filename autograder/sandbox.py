"""How a grading worker is started: bubblewrap namespaces, an unprivileged uid, resource limits.

* **bubblewrap** (Debian's ``bwrap``): new mount, PID, network, IPC and UTS namespaces. The worker sees
  only the Python installation and the grader's own packages, read-only, plus a private ``/tmp``:
  no solutions, no gradebook, no other submissions, no network (loopback stays up, so gloo ranks can
  still talk to each other).
* **setpriv** to an unprivileged uid when the grader runs as root, with no new privileges and no
  capabilities.
* **rlimits** on address space, file size (this is also the output limit), processes and open files.

Where bubblewrap is missing or cannot create namespaces, the worker runs with rlimits only, and the
grader prints a warning saying exactly that.
"""
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

NOBODY = 65534
UID_BASE = 64000  # workers run as 64000, 64001, ... one uid per concurrent worker


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 4 << 30      # address space per process (torch needs ~1.5 GiB to import and train)
    output_bytes: int = 8 << 20      # any file written, the captured output included
    processes: int = 512             # processes + threads of the sandbox uid (ranks, DataLoader workers)
    open_files: int = 512
    tmp_bytes: int = 256 << 20       # the private /tmp (counts against memory)

    def apply(self) -> None:
        """Set in the forked child just before exec (``preexec_fn``)."""
        for limit, value in ((resource.RLIMIT_AS, self.memory_bytes), (resource.RLIMIT_FSIZE, self.output_bytes),
                             (resource.RLIMIT_NPROC, self.processes), (resource.RLIMIT_NOFILE, self.open_files),
                             (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(limit, (value, value))


class UidPool:
    """Hands each concurrent worker its own unprivileged uid.

    The process limit (RLIMIT_NPROC) counts per uid, so with a shared uid one student's fork bomb would
    stop the next student's ranks from starting.
    """

    def __init__(self, base: int):
        self.base, self._free, self._lock = base, [], threading.Lock()
        self._next = base

    @contextmanager
    def take(self):
        with self._lock:
            uid = self._free.pop() if self._free else self._next
            self._next += uid == self._next
        try:
            yield uid
        finally:
            with self._lock:
                self._free.append(uid)


@dataclass(frozen=True)
class Sandbox:
    mode: str                 # "bubblewrap", "rlimits" or "off"
    limits: Limits
    uid: int | None           # first uid workers run as, when we switch users (we are root)
    warning: str = ""
    uids: UidPool | None = field(default=None, compare=False, repr=False)

    @contextmanager
    def worker_command(self, argv: list[str]):
        """The command line that starts one worker, valid while the block runs (it holds a uid)."""
        if self.mode != "bubblewrap":
            yield argv
        elif self.uid is None:
            yield _bwrap_args(self.limits, None) + argv
        else:
            with self.uids.take() as uid:
                yield _bwrap_args(self.limits, uid) + argv

    def __reduce__(self):  # a fresh uid pool wherever the sandbox is unpickled (Dask workers)
        return (Sandbox, (self.mode, self.limits, self.uid, self.warning,
                          UidPool(self.uid) if self.uid is not None else None))

    def describe(self) -> str:
        who = f"uids from {self.uid}" if self.uid is not None else f"uid {os.getuid()}"
        return {"bubblewrap": f"bubblewrap namespaces (no network, private /tmp, read-only Python), {who}, rlimits",
                "rlimits": f"rlimits only, {who}", "off": "no isolation"}[self.mode]


def _etc_files() -> str:
    """A tiny /etc for the sandbox: the hostname resolves (gloo asks), the uid has a name."""
    folder = tempfile.mkdtemp(prefix="grader-etc-")
    Path(folder, "hosts").write_text("127.0.0.1 localhost grader\n")
    students = "".join(f"student{i}:x:{UID_BASE + i}:{UID_BASE + i}::/tmp:/bin/false\n" for i in range(256))
    Path(folder, "passwd").write_text(f"root:x:0:0::/:/bin/false\nnobody:x:{NOBODY}:{NOBODY}::/tmp:/bin/false\n" + students)
    Path(folder, "group").write_text(f"root:x:0:\nnogroup:x:{NOBODY}:\n")
    for name in os.listdir(folder):
        os.chmod(Path(folder, name), 0o644)
    os.chmod(folder, 0o755)
    return folder


@cache
def _etc() -> str:
    return _etc_files()


def _readonly_trees() -> list[Path]:
    """The interpreter, its environment and the grader's packages; nothing else of the host."""
    import autograder
    import coursekit

    trees = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
             Path(autograder.__file__).resolve().parent, Path(coursekit.__file__).resolve().parent}
    return sorted(t for t in trees if not any(o != t and o in t.parents for o in trees))


def _bwrap_args(limits: Limits, uid: int | None) -> list[str]:
    import autograder

    args = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "grader",
            "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
            "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm"]
    for name in ("hosts", "passwd", "group"):
        args += ["--ro-bind", f"{_etc()}/{name}", f"/etc/{name}"]
    # The private /tmp first: a course checked out under /tmp is then bound on top of it, not hidden by it.
    args += ["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]
    made = {Path("/"), Path("/tmp")}
    for tree in _readonly_trees():
        for parent in reversed(tree.parents):  # bwrap would create missing parents with mode 0700
            if parent not in made:
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        args += ["--ro-bind", str(tree), str(tree)]
    course_state = Path(autograder.__file__).resolve().parent / "course"
    if course_state.exists():  # the nbgrader course folder (gradebook, submissions) stays hidden
        args += ["--tmpfs", str(course_state)]
    args += ["--chdir", "/tmp", "--clearenv"]
    for key, value in _worker_env(home="/tmp").items():
        args += ["--setenv", key, value]
    args += ["--setenv", "AUTOGRADER_OWN_PID_NAMESPACE", "1", "--"]
    if uid is not None:
        args += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                 "--inh-caps=-all", "--bounding-set=-all"]
    return args


def _worker_env(home: str) -> dict[str, str]:
    return {"HOME": home, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "KINETO_LOG_LEVEL": "6", "MPLBACKEND": "Agg",
            "TORCH_CPP_LOG_LEVEL": "ERROR",  # c10d warns about the sandbox's hostname once per rank
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "MPLCONFIGDIR": f"{home}/.mpl"}


def worker_env(sandbox: Sandbox, workdir: str) -> dict[str, str] | None:
    """Environment for the worker process (bubblewrap sets its own inside the sandbox)."""
    if sandbox.mode == "bubblewrap":
        return None
    env = _worker_env(home=workdir)
    if os.environ.get("COURSE_ROOT"):
        env["COURSE_ROOT"] = os.environ["COURSE_ROOT"]
    return env


def _bwrap_works() -> bool:
    if not shutil.which("bwrap"):
        return False
    probe = subprocess.run(["bwrap", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "true"],
                           capture_output=True)
    return probe.returncode == 0


def make_sandbox(enabled: bool = True, limits: Limits | None = None, uid: int | None = None) -> Sandbox:
    """Pick the strongest isolation this machine allows and say what was chosen."""
    limits = limits or Limits()
    if not enabled:
        return Sandbox("off", limits, None, "Isolation is off (--no-sandbox): submitted code runs with your rights.")
    if _bwrap_works():
        if os.geteuid() != 0:  # already unprivileged: keep our uid
            return Sandbox("bubblewrap", limits, None)
        base = uid if uid is not None else UID_BASE
        return Sandbox("bubblewrap", limits, base, uids=UidPool(base))
    reason = ("bubblewrap (bwrap) is not installed" if not shutil.which("bwrap")
              else "bubblewrap cannot create namespaces here")
    return Sandbox("rlimits", limits, None,
                   f"WARNING: {reason}; submitted code runs with resource limits only: it can read your files "
                   "and reach the network. Install Debian's `bubblewrap` package for full isolation.")
