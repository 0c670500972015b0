"""Limits per worker that hold whatever the student's code does: CPU share, total memory, process count.

rlimits count per process (memory) or per uid (processes), and the scheduler shares the CPU per session,
so a student who starts hundreds of sessions, threads or processes could starve the students graded next
to them. A control group per worker, created and killed from outside the sandbox, bounds the student's
code as a whole. Two ways, the first the machine allows:

* **systemd** (PID 1 is systemd, cgroup v2): each worker starts under ``systemd-run --scope`` (``--user``
  for an unprivileged grader, whose user manager holds a delegated subtree) with ``CPUWeight``,
  ``MemoryMax`` and ``TasksMax``; ``systemctl kill`` ends the scope.
* **cgroup v1** (mounted at /sys/fs/cgroup/<controller>): a group ``autograder-<pid>-<n>`` per worker under
  the grader's own group in the cpu, memory and pids hierarchies (writable as root, or where an admin
  delegated the grader's group by ``chown``), with ``cpu.shares``, ``memory.limit_in_bytes`` and
  ``pids.max``. Every process in it is killed when the worker ends, and the group is removed.

Neither: the grader warns once and relies on rlimits and the PID namespace (see ``launch.py``).
"""
import itertools
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CONTROLLERS = ("cpu", "memory", "pids")
CPU_SHARES = 1024                 # every worker weighs the same, however many processes it runs
_counter = itertools.count()


@dataclass(frozen=True)
class CgroupPlan:
    backend: str                          # "systemd", "v1" or "" (none)
    parents: tuple[tuple[str, str], ...] = ()   # v1: (controller, the folder our groups go in)
    user: bool = False                    # systemd: the user's manager
    reason: str = ""                      # why none is available

    def describe(self) -> str:
        return {"systemd": "cgroup limits via systemd-run --scope", "v1": "cgroup v1 limits (cpu, memory, pids)",
                "": "no cgroup limits"}[self.backend]


def _v1_parents() -> dict[str, Path]:
    """The grader's own group in each v1 hierarchy we need, from /proc/self/{mountinfo,cgroup}."""
    mounts = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fstype, _, options = (after.split() + ["", "", ""])[:3]
        if fstype == "cgroup":
            for controller in options.split(","):
                mounts.setdefault(controller, (Path(before.split()[4]), before.split()[3]))
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            own[controller] = path
    parents = {}
    for controller in CONTROLLERS:
        if controller not in mounts or controller not in own:
            continue
        mountpoint, root = mounts[controller]
        path = own[controller]
        if root != "/" and path.startswith(root):  # a bind-mounted subtree (containers)
            path = path[len(root):]
        parents[controller] = mountpoint / path.lstrip("/")
    return parents


def _usable_v1(parents: dict[str, Path]) -> bool:
    for parent in parents.values():
        probe = parent / f"autograder-probe-{os.getpid()}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError:
            return False
        _remove_stale(parent)
    return set(parents) == set(CONTROLLERS)


def _remove_stale(parent: Path) -> None:
    """Groups an earlier, killed grader left behind (its pid is gone); they are empty by then."""
    for group in parent.glob("autograder-*-*"):
        pid = group.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            try:
                group.rmdir()
            except OSError:
                pass


def _systemd_works(user: bool) -> bool:
    if not (Path("/run/systemd/system").is_dir() and shutil.which("systemd-run")):
        return False
    probe = ["systemd-run", *(["--user"] if user else []), "--scope", "--quiet", "--collect", "-p", "TasksMax=8", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def detect() -> CgroupPlan:
    user = os.geteuid() != 0
    if _systemd_works(user):
        return CgroupPlan("systemd", user=user)
    try:
        parents = _v1_parents()
    except OSError:
        parents = {}
    if parents and _usable_v1(parents):
        return CgroupPlan("v1", tuple((c, str(p)) for c, p in sorted(parents.items())))
    if not Path("/run/systemd/system").is_dir():
        why = "systemd is not this machine's init (no systemd-run scopes)"
    else:
        why = "systemd-run --scope failed" + (" (no user manager with delegated cgroups)" if user else "")
    if parents:
        why += "; the grader's cgroup v1 groups are not writable (run as root, or chown them to this user)"
    return CgroupPlan("", reason=why)


class ControlGroup:
    """One control group this program creates and removes: a folder per controller under cgroup v1, one folder under
    v2. The grader's workers and the class hub's users (``hub/limits.py``) both use it."""

    def __init__(self, folders: dict[str, Path]):
        self.folders = folders  # controller ("cpu", "memory", "pids"; "unified" under v2) -> its folder

    def create(self, limits: dict[str, int | str]) -> None:
        """Make the folders and write each limit file (``memory.max``, ``cpu.shares``…) into the folder of the
        controller its name starts with (under v2, the one folder)."""
        for folder in self.folders.values():
            folder.mkdir(parents=True, exist_ok=True)
        for name, value in limits.items():
            _write(self.folders.get(name.partition(".")[0], self.folders.get("unified")) / name, value)

    def join(self, pid: int | None = None) -> None:
        """Move a process (the caller by default: a ``preexec_fn``, before it runs anything) into the group."""
        data = str(pid or os.getpid()).encode()
        for folder in self.folders.values():
            fd = os.open(folder / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    def members(self) -> set[int]:
        pids = set()
        for folder in self.folders.values():
            try:
                pids |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return pids

    def read(self, name: str) -> str:
        return (self.folders.get(name.partition(".")[0], self.folders.get("unified")) / name).read_text().strip()

    def kill_all(self) -> None:
        """SIGKILL every process in the group, until none is left (new forks included)."""
        for _ in range(500):
            pids = self.members()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)

    def remove(self, *, kill: bool = True) -> None:
        """Remove the folders (cgroup folders go with rmdir; their control files with them). ``kill``: end what is
        left in it first; else a group that still holds processes stays."""
        if kill:
            self.kill_all()
        for folder in self.folders.values():
            for _ in range(100 if kill else 1):  # the kernel releases a group shortly after its last process is reaped
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


class WorkerGroup:
    """The control group of one worker: how to start inside it, and how to end everything in it."""

    def __init__(self, plan: CgroupPlan, memory_bytes: int, processes: int):
        self.plan, self.name = plan, f"autograder-{os.getpid()}-{next(_counter)}"
        self.memory_bytes, self.processes = memory_bytes, processes
        self.group = ControlGroup({c: Path(p) / self.name for c, p in plan.parents})
        if plan.backend == "v1":
            limits = {"cpu.shares": CPU_SHARES, "memory.limit_in_bytes": memory_bytes, "pids.max": processes}
            if (Path(dict(plan.parents)["memory"]) / "memory.memsw.limit_in_bytes").exists():  # no swapping past it
                limits["memory.memsw.limit_in_bytes"] = memory_bytes
            self.group.create(limits)

    def command_prefix(self) -> list[str]:
        if self.plan.backend != "systemd":
            return []
        return ["systemd-run", *(["--user"] if self.plan.user else []), "--scope", "--quiet", "--collect",
                f"--unit={self.name}", "-p", "CPUWeight=100", "-p", f"MemoryMax={self.memory_bytes}",
                "-p", "MemorySwapMax=0", "-p", f"TasksMax={self.processes}", "--"]

    def join(self) -> None:
        """Move the calling process into the group (``preexec_fn``: before the worker runs anything)."""
        self.group.join()

    def kill_all(self) -> None:
        if self.plan.backend == "systemd":
            subprocess.run(["systemctl", *(["--user"] if self.plan.user else []), "kill", "--signal=SIGKILL",
                            f"{self.name}.scope"], capture_output=True, timeout=30)
            return
        self.group.kill_all()

    def remove(self) -> None:
        self.kill_all()
        self.group.remove()


def _write(path: Path, value: int) -> None:
    path.write_text(str(value))
