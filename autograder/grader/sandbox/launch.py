"""How a grading worker is started: bubblewrap namespaces, an unprivileged uid, resource limits.

* **bubblewrap** (Debian's ``bwrap``): new mount, PID, network, IPC and UTS namespaces. The worker sees
  only the Python installation and the grader's own packages, read-only, plus a private ``/tmp``:
  no solutions, no gradebook, no other submissions, no network (loopback stays up, so gloo ranks can
  still talk to each other).
* **setpriv** to an unprivileged uid of its own per worker when the grader runs as root, with no new privileges
  and no capabilities; an ordinary user's grader does the same inside ``unshare`` with its subordinate uids where
  ``/etc/subuid`` gives it some (``identity.py``), else every worker runs as the grader's own uid.
* **forbidden libraries switched off** in students' workers (``forbidden.py``): stubs bound over torch's DDP, FSDP,
  tensor parallelism and ZeroRedundancyOptimizer. The reference's worker keeps them.
* **ranks isolated from each other** (``isolation.py``): every rank a grading worker forks gets namespaces of its
  own, so ranks exchange data only through the loopback the grader counts, and cannot stop the measuring process.
* **rlimits** on address space, file size (this is also the output limit), processes and open files.
* **a control group per worker** (``cgroups.py``): CPU share, total memory and process count for the
  student's code as a whole, and a way to kill all of it from outside.
* **devices** (``devices.py``), the same for every worker: the CPU only (``CUDA_VISIBLE_DEVICES=""``), or
  a GPU that a probe worker proved usable: its device nodes bound into the sandbox's ``/dev``, ``/sys`` and
  ``/etc/ld.so.cache`` read-only, and no address-space rlimit (CUDA reserves a huge virtual range); memory
  is then bounded by the worker's cgroup where there is one.

Where bubblewrap is missing or cannot create namespaces, the worker runs with rlimits only (no stubs, no rank
isolation); where no cgroup can be made, without the per-worker totals. A probe worker (``probe.py``) proves the
stubs and the rank isolation work here before any student's code runs. The grader prints one warning saying
exactly what is missing.
"""
import atexit
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

from . import forbidden, isolation, probe
from .cgroups import CgroupPlan, WorkerGroup, detect
from .devices import CPU_ONLY, PROBE, Devices, gpu_candidate
from .identity import SubIds, subordinate_ids, works

AUTOGRADER = Path(__file__).resolve().parents[2]  # the grader's own package
NOBODY = 65534
UID_BASE = 64000  # workers run as 64000, 64001, ... one uid per concurrent worker


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 4 << 30      # address space per process (torch needs ~1.5 GiB to import and train)
    output_bytes: int = 8 << 20      # any file written, the captured output included
    processes: int = 512             # processes + threads of one worker (ranks, DataLoader workers)
    open_files: int = 512
    tmp_bytes: int = 256 << 20       # the private /tmp, and /dev/shm the same (both count against memory)
    total_memory_bytes: int = 4 << 30  # everything one worker holds, its tmpfs included (cgroup)

    def apply(self, processes: bool = True, address_space: bool = True) -> None:
        """Set in the forked child just before exec (``preexec_fn``). The process limit is left to the
        worker itself under bubblewrap (see worker.main): set here, an unprivileged grader's user
        namespaces would all count against this one number. GPU workers get no address-space limit:
        CUDA reserves far more virtual memory than any such limit allows, and would not start."""
        for limit, value in ((resource.RLIMIT_AS, self.memory_bytes if address_space else None),
                             (resource.RLIMIT_FSIZE, self.output_bytes),
                             (resource.RLIMIT_NPROC, self.processes if processes else None),
                             (resource.RLIMIT_NOFILE, self.open_files), (resource.RLIMIT_CORE, 0)):
            if value is not None:
                resource.setrlimit(limit, (value, value))


class UidPool:
    """Hands each concurrent worker its own unprivileged uid.

    The process limit (RLIMIT_NPROC) counts per uid, so with a shared uid one student's fork bomb would
    stop the next student's ranks from starting.
    """

    def __init__(self, base: int):
        self.base, self._free, self._lock = base, [], threading.Lock()
        self._next = base

    def __reduce__(self):  # a fresh pool wherever it is unpickled (its lock cannot travel)
        return (UidPool, (self.base,))

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
class Launch:
    """How to start one worker: its command line, environment and pre-exec step; ``kill_all`` ends
    everything it started (the whole cgroup where there is one, else its process group)."""
    command: list[str]
    env: dict[str, str]
    preexec: object
    group: WorkerGroup | None

    def kill_all(self, pid: int) -> None:
        try:
            os.killpg(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        if self.group:
            self.group.kill_all()


@dataclass(frozen=True)
class Sandbox:
    mode: str                 # "bubblewrap", "rlimits" or "off"
    limits: Limits
    uid: int | None           # first uid workers run as, when we switch users (we are root)
    warning: str = ""
    uids: UidPool | None = field(default=None, compare=False, repr=False)
    cgroups: CgroupPlan = CgroupPlan("")
    stubs: forbidden.Stubs = forbidden.Stubs(reason="not probed")   # bound in students' workers only
    isolate_ranks: bool = False    # every rank a worker forks gets namespaces of its own (isolation.py)
    subids: SubIds | None = None   # an unprivileged grader's subordinate uids: one kernel uid per worker
    devices: Devices = CPU_ONLY    # the same for every worker: the reference's and each student's

    @contextmanager
    def launch(self, argv: list[str], workdir: str, *, reference: bool = False, zygote: bool = False):
        """How to start one worker (the reference's keeps the forbidden libraries; a ``zygote``, worker.py, is its
        namespace's PID 1 under one identity: ``_bwrap_args``); valid while the block runs (it holds a uid and a
        cgroup)."""
        group = WorkerGroup(self.cgroups, self.limits.total_memory_bytes, self.limits.processes) \
            if self.mode != "off" and self.cgroups.backend else None
        try:
            with (self.uids.take() if self.uids else _no_uid()) as uid:
                yield self._launch(argv, workdir, uid, group, reference, zygote)
        finally:
            if group:
                group.remove()

    def _launch(self, argv: list[str], workdir: str, uid: int | None, group: WorkerGroup | None,
                reference: bool = False, zygote: bool = False) -> Launch:
        prefix = group.command_prefix() if group else []
        env = _worker_env(home=workdir, devices=self.devices)
        if self.mode == "off":
            return Launch(argv, env, None, None)
        limits, address_space = self.limits, not self.devices.cuda

        def preexec():
            if group:
                group.join()
            limits.apply(processes=self.mode != "bubblewrap", address_space=address_space)

        if self.mode == "rlimits":
            return Launch(prefix + argv, env, preexec, group)
        # bubblewrap itself runs with a scrubbed environment too: it is the sandbox's PID 1, and an
        # unprivileged grader's student code (same uid) could read /proc/1/environ.
        if self.subids:  # root of a user namespace of our subordinate uids: setpriv then gives a kernel uid of its own
            prefix += self.subids.prefix(self.uid, limits.processes)
        stubs = () if reference else self.stubs.args()
        return Launch(prefix + _bwrap_args(limits, uid, self.devices, stubs, self.isolate_ranks, zygote) + argv, env,
                      preexec, group)

    def __reduce__(self):  # a fresh uid pool wherever the sandbox is unpickled (Dask workers)
        return (Sandbox, (self.mode, self.limits, self.uid, self.warning,
                          UidPool(self.uid) if self.uid is not None else None, self.cgroups, self.stubs,
                          self.isolate_ranks, self.subids, self.devices))

    @property
    def one_identity(self) -> bool:
        """Every worker runs as the grader's own uid: per-user kernel quotas (processes, inotify and epoll watches,
        message queues) are then shared by all the students graded at once, so one student's code could make
        another's ranks fail. Rank exercises are then graded one student at a time (isolation.py)."""
        return self.uid is None

    def describe(self) -> str:
        who = f"uids from {self.uid}" if self.uid is not None else f"uid {os.getuid()}"
        if self.subids:
            who += f" ({self.subids.describe()})"
        if self.mode == "bubblewrap":
            who += f", {self.stubs.describe()}" + (", ranks isolated" if self.isolate_ranks else ", ranks not isolated")
        return {"bubblewrap": f"bubblewrap namespaces (no network, private /tmp, read-only Python), {who}, rlimits",
                "rlimits": f"rlimits only, {who}", "off": "no isolation"}[self.mode] + \
            (f", {self.cgroups.describe()}" if self.mode != "off" else "")

    def allowing(self, libraries: tuple[str, ...]) -> "Sandbox":
        """This sandbox with the forbidden ``libraries`` left in place (``forbidden.Stubs.without``)."""
        return replace(self, stubs=self.stubs.without(libraries)) if libraries else self

    def fingerprint(self) -> str:
        """What a saved result depends on besides the code: isolation, every limit and the devices."""
        return (f"{self.mode}|{self.uid is not None}|{self.cgroups.backend}|{self.limits}|{self.devices.describe()}"
                f"|stubs={len(self.stubs.binds)}|isolated={self.isolate_ranks}")


@contextmanager
def _no_uid():
    yield None


def _etc_files() -> str:
    """A tiny /etc for the sandbox: the hostname resolves (gloo asks), the uid has a name."""
    folder = tempfile.mkdtemp(prefix="grader-etc-")
    creator = os.getpid()
    # removed when the grader exits; a forked worker inherits the hook and must not remove its parent's folder
    atexit.register(lambda: os.getpid() == creator and shutil.rmtree(folder, ignore_errors=True))
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
    """The interpreter, its environment and the grader's packages; nothing else of the host.

    Site-packages folders on ``sys.path`` count as the environment (a venv may reach another one through
    a ``.pth`` file); the folder the grader was started from (``sys.path[0]``, maybe the course) does not.
    """
    trees = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), AUTOGRADER, _coursekit_folder()}
    trees |= {Path(p).resolve() for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()}
    return sorted(t for t in trees if not any(o != t and o in t.parents for o in trees))


def _private_to_us(depth: int = 3) -> str:
    """A folder of the trees a worker sees (or the interpreter) that other users cannot enter or read, or "".
    bubblewrap makes the trees' parent folders; the trees themselves keep their modes. A private environment or
    course is private near its top (``lib/python3.X/site-packages`` is 3 deep), so the walk stops there; the
    system's /usr (a Debian Python) is the distribution's, with folders private by design, and not ours to judge."""
    pending = [(tree, 0) for tree in _readonly_trees() if tree != Path("/usr") and Path("/usr") not in tree.parents]
    while pending:
        folder, level = pending.pop()
        try:
            if os.stat(folder).st_mode & 0o005 != 0o005:
                return str(folder)
            if level < depth:
                pending += [(Path(e.path), level + 1) for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
    executable = os.path.realpath(sys.executable)
    return "" if os.stat(executable).st_mode & 0o005 == 0o005 else executable


def _device_args(devices: Devices) -> list[str]:
    """A GPU worker's extra view: its device nodes in the fresh /dev, and read-only what the CUDA driver reads
    (/sys: PCI and NUMA topology, without which cuInit fails; the loader's cache, to find libcuda)."""
    if not devices.cuda:
        return []
    args = []
    for host, inside in devices.nodes:
        args += ["--dev-bind", host, inside]
    for path in ("/sys", "/etc/ld.so.cache"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _bwrap_args(limits: Limits, uid: int | None, devices: Devices = CPU_ONLY, stubs: tuple | list = (),
                isolate_ranks: bool = False, zygote: bool = False) -> list[str]:
    args = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "grader",
            "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
            "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/dev/shm"]
    args += _device_args(devices)
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
    args += list(stubs)  # over the read-only Python trees they cover (forbidden.py)
    args += ["--chdir", "/tmp", "--clearenv"]
    for key, value in _worker_env(home="/tmp", devices=devices).items():
        args += ["--setenv", key, value]
    if isolate_ranks:  # the size of each rank's private /tmp and /dev/shm (isolation.py)
        args += ["--setenv", "AUTOGRADER_ISOLATE_RANKS", str(limits.tmp_bytes)]
    args += ["--setenv", "AUTOGRADER_OWN_PID_NAMESPACE", "1"]
    if zygote and uid is None:  # the zygote is PID 1 itself: bubblewrap's own init would be of the tasks' uid, its
        args.append("--as-pid-1")  # memory writable (/proc/1/mem), and it outlives the sweep between two students
    args.append("--")
    if uid is not None:
        args += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                 "--inh-caps=-all", "--bounding-set=-all"]
    return args


def _worker_env(home: str, devices: Devices = CPU_ONLY) -> dict[str, str]:
    return {"HOME": home, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "KINETO_LOG_LEVEL": "6", "MPLBACKEND": "Agg",
            "TORCH_CPP_LOG_LEVEL": "ERROR",  # c10d warns about the sandbox's hostname once per rank
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "MPLCONFIGDIR": f"{home}/.mpl",
            # glibc reads this at start only: a freed tensor then leaves the resident memory the meter reads
            # (else glibc's threshold rises to the largest block freed, and freed layers stay resident)
            "MALLOC_MMAP_THRESHOLD_": "65536",
            "PYTHONPATH": os.pathsep.join(_our_package_parents()),  # the grader's own autograder and coursekit
            **devices.env()}


def _our_package_parents() -> list[str]:
    """Where the grader's own packages live: a worker imports exactly these (not another installed copy)."""
    return sorted({str(AUTOGRADER.parent), str(_coursekit_folder().parent)})


def _coursekit_folder() -> Path:
    """Found, not imported: coursekit imports torch, which the grader's own process never loads (1.5 s, and its
    memory)."""
    return Path(importlib.util.find_spec("coursekit").origin).resolve().parent


def _bwrap_works() -> bool:
    if not shutil.which("bwrap"):
        return False
    probe = subprocess.run(["bwrap", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/", "true"],
                           capture_output=True)
    return probe.returncode == 0


def make_sandbox(enabled: bool = True, limits: Limits | None = None, uid: int | None = None, *,
                 gpu: bool = True, dev_root: str = "/dev") -> Sandbox:
    """Pick the strongest isolation this machine allows and the devices every worker gets (a GPU only where
    ``gpu`` and a probe worker could use it), and say, in one warning, what is missing."""
    return with_devices(with_probe(_isolation(enabled, limits or Limits(), uid)), gpu, dev_root)


def _isolation(enabled: bool, limits: Limits, uid: int | None) -> Sandbox:
    if not enabled:
        return Sandbox("off", limits, None, "Isolation is off (--no-sandbox): submitted code runs with your rights.")
    plan = detect()
    missing = "" if plan.backend else (
        f"no per-student CPU share or total-memory limit ({plan.reason}): one student's many processes can "
        "slow the students graded next to them (their own time limit and process count still hold)")
    if _bwrap_works():
        warning = f"WARNING: {missing}." if missing else ""
        if os.geteuid() != 0:  # unprivileged: our subordinate uids, one per worker, or else our own uid for all
            subids, base = subordinate_ids(), uid if uid is not None else UID_BASE
            private = _private_to_us() if subids else ""
            if subids and not private and not works(subids, base):
                return Sandbox("bubblewrap", limits, base, warning, uids=UidPool(base), cgroups=plan, subids=subids)
            if private:  # e.g. a class hub's instructor environment, readable by the instructors' group only
                warning = " ".join(w for w in (warning, f"WARNING: workers run under your own uid, not your "
                                   f"subordinate uids: {private} is not readable by other users.") if w)
            return Sandbox("bubblewrap", limits, None, warning, cgroups=plan)
        base = uid if uid is not None else UID_BASE
        return Sandbox("bubblewrap", limits, base, warning, uids=UidPool(base), cgroups=plan)
    reason = ("bubblewrap (bwrap) is not installed" if not shutil.which("bwrap")
              else "bubblewrap cannot create namespaces here")
    return Sandbox("rlimits", limits, None,
                   f"WARNING: {reason}; submitted code runs with resource limits only: it can read your files "
                   "and reach the network. Install Debian's `bubblewrap` package for full isolation."
                   + (f" Also {missing}." if missing else ""), cgroups=plan)


class WorkersCannotStart(RuntimeError):
    """A worker cannot even start under its own uid: no student could be graded, so the class is not begun."""


def with_probe(sandbox: Sandbox) -> Sandbox:
    """The sandbox with the forbidden libraries switched off and ranks isolated, as far as a probe worker exactly
    like a student's (``probe.py``) shows they work here; what does not is added to the warning."""
    if sandbox.mode == "off":
        return sandbox
    if sandbox.mode == "rlimits":
        return _warn(replace(sandbox, stubs=forbidden.Stubs(reason="no bubblewrap to bind stubs over them")),
                     "without bubblewrap, the libraries an exercise forbids (DDP, FSDP, ...) stay importable in "
                     "students' code and a student's ranks are not isolated from each other")
    stubs = forbidden.locate()
    answer = probe.cached_probe(replace(sandbox, stubs=stubs))
    if "failed to execute" in str(answer.get("error", "")):  # setpriv: the workers' uid cannot run this Python
        raise WorkersCannotStart(
            f"grading workers run under uids of their own and cannot start this Python ({answer['error']}). Make "
            f"its environment and the course's autograder/ and coursekit/ readable by every user (e.g. chmod -R "
            f"o+rX {sys.prefix}); solutions/ and classroom/ can stay private.")
    problems = []
    if stubs.binds and (problem := probe.stub_problem(answer)):
        stubs = forbidden.Stubs(reason=f"the stubs do not fit this torch: {problem}")
        problems.append(f"the stubs that switch off the libraries an exercise forbids do not fit this torch "
                        f"({problem}): they stay importable in students' code")
    elif not stubs.binds:
        problems.append(f"the libraries an exercise forbids stay importable in students' code ({stubs.reason})")
    elif stubs.missing:
        problems.append(f"this torch has no {', '.join(stubs.missing)}: not switched off")
    found = None if "error" in answer else answer.get("isolation")
    gaps = isolation.describe(found) if isinstance(found, dict) else f"ranks are not isolated ({answer.get('error')})"
    if gaps:
        problems.append(gaps)
    isolate = isinstance(found, dict) and not found.get("namespaces")
    return _warn(replace(sandbox, stubs=stubs, isolate_ranks=isolate), "; ".join(problems))


def _warn(sandbox: Sandbox, problem: str) -> Sandbox:
    if not problem:
        return sandbox
    return replace(sandbox, warning=" ".join(w for w in (sandbox.warning, f"WARNING: {problem}.") if w))


def with_devices(sandbox: Sandbox, gpu: bool = True, dev_root: str = "/dev") -> Sandbox:
    """The sandbox with the devices every worker gets, decided here once, in the trusted grader, which never
    starts CUDA itself (a probe worker does, under the very isolation, limits and devices the workers get)."""
    if not gpu:
        return replace(sandbox, devices=Devices(reason="GPU grading turned off with --cpu-only"))
    candidate = gpu_candidate(dev_root)
    if candidate is None:
        return replace(sandbox, devices=CPU_ONLY)
    names, error = probe_devices(replace(sandbox, devices=candidate))
    if error:
        if not any(inside == "/dev/nvidia-uvm" for _, inside in candidate.nodes):  # made on the host's first CUDA use
            error += "; /dev/nvidia-uvm does not exist yet: run nvidia-smi or any CUDA program once, then grade again"
        warning = (f"WARNING: a GPU is present but CUDA did not start in a grading worker ({error}); grading on the "
                   "CPU only, so CUDA scenarios are not graded for anyone (--cpu-only says so without trying).")
        return replace(sandbox, devices=Devices(reason="CUDA did not start in a grading worker"),
                       warning=" ".join(w for w in (sandbox.warning, warning) if w))
    warning = sandbox.warning
    if sandbox.mode != "off" and not sandbox.cgroups.backend:
        warning = " ".join(w for w in (warning, "WARNING: GPU workers run without the address-space limit (CUDA "
                                       "reserves more than any such limit) and no cgroup bounds their memory here: "
                                       "one student's code can use all of this machine's memory.") if w)
    return replace(sandbox, devices=replace(candidate, names=names), warning=warning)


def probe_devices(sandbox: Sandbox, timeout: float = 180.0) -> tuple[tuple[str, ...], str]:
    """Use the GPU once in a process started exactly like a worker of ``sandbox`` (see ``devices.PROBE``).
    Returns (the GPUs' names, "") or ((), why CUDA did not start)."""
    with tempfile.TemporaryDirectory(prefix="grader-probe-") as workdir, \
            sandbox.launch([sys.executable, "-c", PROBE], workdir) as launch:
        try:
            proc = subprocess.Popen(launch.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=workdir,
                                    env=launch.env, start_new_session=True, preexec_fn=launch.preexec)
        except (OSError, subprocess.SubprocessError) as exc:
            return (), f"the probe could not start: {exc}"
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            launch.kill_all(proc.pid)
            proc.communicate()
            return (), f"the probe did not finish within {timeout:g} s"
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        message = json.loads(lines[-1])
    except (IndexError, ValueError):
        message = {}
    names = message.get("names") if isinstance(message, dict) else None
    if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
        return tuple(names), ""
    error = message.get("error") if isinstance(message, dict) else None
    return (), str(error or err.decode(errors="replace").strip()[-300:] or f"the probe exited with {proc.returncode}")
