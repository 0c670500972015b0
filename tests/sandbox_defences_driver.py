"""Checks of the grading sandbox's defences, run by tests/sandbox/test_sandbox_defences.py as root or as an ordinary user
(``python sandbox_defences_driver.py CHECK``); prints one JSON line.

* ``forbidden``: in a student's worker the forbidden libraries raise and torch still imports and compiles; in the
  reference's worker they are the real ones.
* ``sidechannels``: ``sidechannels_inside.py`` in a student's worker, ranks plain (the control) and isolated.
* ``worker``: a rank exercise graded by the real worker (runner.run_tasks), whose cell tries to stop the launcher
  and to leave data in /dev/shm for the other rank.
* ``family``: the peak memory the launcher's meter reads for ranks that hold 64 MiB themselves, in a child, or in
  an orphaned grandchild.
* ``lazy_import``: a rank imports one of the grader's modules after its isolation (the course may be checked out
  under /tmp, which each rank gets fresh).
* ``reuse``: four students graded one after the other by the real runner, in one worker where it can be reused:
  the first leaves files (one in a folder without permissions), SysV IPC objects and a process behind, tries a POSIX
  message queue and keys, and plants, chmods, sets attributes and limits on whatever it can outside /tmp (bubblewrap's
  / and /dev, the packages' parent, the zygote); the second reports what it finds; the third tries to kill the
  worker; the fourth, graded after it, reports too.
* ``costs``: milliseconds per rank fork with and without isolation, microseconds per memory sample.
* ``epoll``: one worker fills its uid's epoll-watch quota (issue 25) while another runs two gloo ranks, with the
  sandbox as made here and with every worker under the grader's own uid (the control).
"""
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from autograder.grader.sandbox.launch import make_sandbox  # noqa: E402

FORBIDDEN_CHECK = r"""
import json, torch, torch.distributed, torch.optim, torch._dynamo
model = torch.nn.Linear(2, 2)
found = {"module_of_ddp": torch.nn.parallel.DistributedDataParallel.__module__,
         "compiled": float(torch.compile(lambda x: torch.cos(x) * 2, backend="eager")(torch.zeros(1)))}
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
found["fully_shard_is_function"] = callable(fully_shard) and not isinstance(fully_shard, type)
found["zero_has_step"] = hasattr(ZeroRedundancyOptimizer, "step")
try:
    import importlib.machinery, os
    path = os.path.join(os.path.dirname(torch.nn.parallel.__file__), "__pycache__", "distributed.cpython-311.pyc")
    importlib.machinery.SourcelessFileLoader("recovered", path).load_module()
    found["pyc"] = "loaded"
except Exception as exc:
    found["pyc"] = type(exc).__name__
found["max_user_namespaces"] = int(open("/proc/sys/user/max_user_namespaces").read())
print(json.dumps(found))
"""

HOSTILE_CELL = '''
import os, signal, socket, time
rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
try:
    os.kill(os.getppid(), signal.SIGSTOP)
    stop = "the launcher stopped"
except OSError as exc:
    stop = exc.strerror
if rank == 0:
    open("/dev/shm/left-by-rank-0", "w").write("x")
print(f"rank {rank} printed this")
# Every rank waits here until all have printed (over the ranks' own loopback; the cells run before the process
# group exists): otherwise the first rank to raise ends the scenario before a slower one has printed.
port = int(os.environ["MASTER_PORT"]) + 1
if rank == 0:
    with socket.create_server(("127.0.0.1", port)) as server:
        peers = [server.accept()[0] for _ in range(world_size - 1)]
    for peer in peers:
        peer.sendall(b"go")
        peer.close()
else:
    for _ in range(6000):
        try:
            with socket.create_connection(("127.0.0.1", port)) as peer:
                peer.recv(2)
            break
        except OSError:
            time.sleep(0.01)
seen = os.path.exists("/dev/shm/left-by-rank-0")
raise RuntimeError(f"rank {rank}: stop: {stop}; sees rank 0's file: {seen}")
'''

FILL = r"""
import errno, json, os, select, sys, time
hold, per = float(sys.argv[1]), 240   # 240 epoll instances x 240 descriptors per process (512 open files allowed)
added, errors, full = 0, set(), False
for _ in range(400):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        n, error = 0, 0
        try:
            fds, eps = [os.dup(w) for _ in range(per)], []
            for _ in range(per):
                eps.append(select.epoll())
                for fd in fds:
                    eps[-1].register(fd, select.EPOLLOUT)
                    n += 1
        except OSError as exc:
            error = exc.errno
        os.write(w, json.dumps({"n": n, "error": error}).encode())
        time.sleep(hold)
        os._exit(0)
    os.close(w)
    message = json.loads(os.read(r, 200))
    os.close(r)
    added += message["n"]
    errors.add(errno.errorcode.get(message["error"], "none"))
    if message["error"] == errno.ENOSPC:  # this uid's fs.epoll.max_user_watches is reached
        full = True
        break
print(json.dumps({"full": full, "watches": added, "errors": sorted(errors)}), flush=True)
time.sleep(hold)
"""

VICTIM = r"""
import datetime, json, os, socket
import torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
r, w = os.pipe()
for rank in range(2):
    if os.fork() == 0:
        try:
            torch.set_num_threads(1)
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                    timeout=datetime.timedelta(seconds=10))
            t = torch.ones(4); dist.all_reduce(t); dist.destroy_process_group()
            result = f"ok {t[0].item()}"
        except BaseException as exc:
            result = f"{type(exc).__name__}: {str(exc)[:120]}"
        os.write(w, (json.dumps(result) + "\n").encode()); os._exit(0)
codes = [os.waitstatus_to_exitcode(os.wait()[1]) for _ in range(2)]
os.close(w)
print(json.dumps({"uid": os.getuid(), "exit": codes, "ranks": [json.loads(x) for x in os.read(r, 4096).decode().splitlines()]}))
"""


FAMILY = r"""
import json, os, time
from autograder.exercises.beside import ranks
from autograder.grader.sandbox import worker
worker._not_dumpable()
worker._configure_ranks(os.pipe()[1])  # as a grading task does (the pipe stands for its channel to the zygote)
MIB = 1 << 20

def holder(seconds):
    import torch
    held = torch.ones(64 * MIB, dtype=torch.uint8)
    time.sleep(seconds)
    return held

def hold(rank, world_size, how):
    if how == "itself":
        holder(0.5)
    elif how == "child":
        pid = os.fork()
        if pid == 0:
            holder(0.5)
            os._exit(0)
        os.waitpid(pid, 0)
    elif how in ("tmpfs", "undumpable tmpfs"):  # files written, never mapped (8 MiB each: the file-size limit)
        for i in range(8):
            with open(f"{('/tmp', '/dev/shm')[i % 2]}/parked-{i}", "wb") as f:
                f.write(bytes(8 * MIB))
        if how == "undumpable tmpfs":  # the launcher's reading of /proc/<pid>/root now fails: never counted as 0
            import ctypes
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
        time.sleep(0.5)
    elif how == "orphan":  # a grandchild that outlives the rank
        pid = os.fork()
        if pid == 0:
            if os.fork() == 0:
                holder(1.5)
                os._exit(0)
            os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.8)
    return 0

found = {}
for counted in ("families", "ranks alone"):
    if counted == "ranks alone":  # the control: the meter's default, each rank process by itself
        ranks.configure(child_setup=ranks._child_setup[0])
    for how in ("nothing", "itself", "child", "orphan", "tmpfs", "undumpable tmpfs"):
        result = ranks.run_on_ranks(hold, 2, how, timeout=30, peaks=True)  # a check reads the peaks
        found[f"{how}, {counted}"] = [p // MIB for p in result["meter"]["peak_bytes"]] if "meter" in result else result
print(json.dumps(found))
"""

LAZY_IMPORT = r"""
import json, os, sys
from pathlib import Path
import coursekit
from autograder.exercises.beside import ranks
from autograder.grader.sandbox import worker
worker._not_dumpable()
worker._configure_ranks(os.pipe()[1])
names = sorted(f"coursekit.{p.stem}" for p in Path(coursekit.__file__).parent.glob("*.py") if p.stem != "__init__")
name = next(n for n in names if n not in sys.modules)

def import_late(rank, world_size, name):
    import importlib
    return importlib.import_module(name).__file__

result = ranks.run_on_ranks(import_late, 2, name, timeout=60)
print(json.dumps({"module": name, "imported_from": result.get("ranks", result), "checkout": os.path.dirname(coursekit.__file__)}))
"""

COSTS = r"""
import json, os, statistics, time
from autograder.exercises.beside import meter
from autograder.grader.sandbox import isolation, worker
from autograder.grader.sandbox import rank_holdings as family
worker._not_dumpable()

def fork_ms(setup):
    times = []
    for _ in range(30):
        r, w = os.pipe()
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            setup()
            os.write(w, b"x")
            os._exit(0)
        os.read(r, 1)
        times.append((time.perf_counter() - start) * 1000)
        os.waitpid(pid, 0)
        os.close(r), os.close(w)
    return round(statistics.median(times), 2)

found = {"fork_ms": fork_ms(lambda: None), "fork_and_isolate_ms": fork_ms(lambda: isolation.isolate_rank(256 << 20))}
for leftover in isolation.rank_outputs():
    leftover.unlink()
pids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        time.sleep(5)
        os._exit(0)
    pids.append(pid)
families = family.RankFamilies(os.getpid(), os.getppid())
for name, held in (("sample_ranks_alone_us", meter.ranks_alone), ("sample_families_us", families.held)):
    start = time.perf_counter()
    for _ in range(1000):
        held(pids, 0)
    found[name] = round((time.perf_counter() - start) * 1000, 1)
for pid in pids:
    os.kill(pid, 9)
print(json.dumps(found))
"""


def run_in(sandbox, argv: list[str], *, reference: bool = False, stdin: str | None = None,
           timeout: float = 600) -> str:
    with tempfile.TemporaryDirectory(prefix="defences-") as workdir, \
            sandbox.launch(argv, workdir, reference=reference) as launch:
        proc = subprocess.run(launch.command, input=stdin, capture_output=True, text=True, cwd=workdir, env=launch.env,
                              preexec_fn=launch.preexec, timeout=timeout)
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]


def forbidden(sandbox) -> dict:
    return {"student": json.loads(run_in(sandbox, [sys.executable, "-c", FORBIDDEN_CHECK])),
            "reference": json.loads(run_in(sandbox, [sys.executable, "-c", FORBIDDEN_CHECK], reference=True))}


def sidechannels(sandbox) -> dict:
    script = (HERE / "sidechannels_inside.py").read_text()
    return {mode: json.loads(run_in(sandbox, [sys.executable, "-", mode], stdin=script)) for mode in ("plain", "isolate")}


def worker(sandbox) -> dict:
    from autograder.authoring.course import load_course
    from autograder.grader.runner import Task, run_tasks

    spec = load_course().spec_for_exercise("average_gradients")
    cells = tuple((f"setup {i}", c) for i, c in enumerate(spec.setup_code)) + (("your cell", HOSTILE_CELL),)
    results, _ = run_tasks([Task("hostile", "average_gradients", cells, 120.0, 0)], sandbox)
    result = results["hostile"]
    return {"status": result.status, "observation": json.dumps(result.observation), "reason": result.reason,
            "output": result.output}


# What a task sees of the sandbox outside /tmp and /dev/shm: bubblewrap's / and /dev, the folders it made for the
# packages (on sys.path), the zygote's limits, keys. The first student looks before and after planting; the next
# one must see what the first saw before.
LOOK = r'''
import json, os, stat
def xattrs(path):
    try:
        return sorted(os.listxattr(path, follow_symlinks=False))
    except OSError as exc:
        return str(exc)
by_bwrap = ["/", "/dev", *os.environ["PYTHONPATH"].split(":")]
look = {"listing": {p: sorted(os.listdir(p)) for p in by_bwrap},
        "modes": {p: oct(os.lstat(p).st_mode) for p in by_bwrap + ["/tmp", "/dev/shm", "/etc"]},
        "xattrs": {p: xattrs(p) for p in by_bwrap + ["/tmp"]},
        "mtimes": {p: os.lstat(p).st_mtime_ns for p in by_bwrap},
        "links": {p: os.readlink(p) for p in ("/bin", "/sbin", "/lib", "/lib64", "/dev/fd") if os.path.islink(p)},
        "zygote_limits": open(f"/proc/{os.getppid()}/limits").read(),  # a task can lower them (prlimit)
        "zygote_nice": os.getpriority(os.PRIO_PROCESS, os.getppid()),
        "keys": [line for line in open("/proc/keys").read().splitlines() if "left_by_a" in line]}
import hashlib  # a digest per part: the feedback keeps only the first characters of what a task prints
look = {part: hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()[:8] for part, seen in look.items()}
'''

LEAVES_BEHIND = LOOK + r'''
import ctypes, resource, socket, subprocess, sys
before = look
open("/tmp/left_by_a.txt", "w").write("secret")
open("/dev/shm/left_by_a", "w").write("secret")
os.makedirs("/tmp/locked/inner")
open("/tmp/locked/inner/f", "w").write("secret")
os.chmod("/tmp/locked/inner", 0), os.chmod("/tmp/locked", 0)
libc = ctypes.CDLL(None, use_errno=True)
made = {"shm": libc.shmget(0x5151, 4096, 0o1666), "sem": libc.semget(0x5152, 1, 0o1666),
        "msg": libc.msgget(0x5153, 0o1666)}
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
made["mq"] = libc.mq_open(b"/left_by_a", os.O_CREAT | os.O_RDWR, 0o666, None)
libc.syscall.restype = ctypes.c_long
for name, keyring in (("user_key", -4), ("session_key", -3)):  # add_key into @u, @s
    made[name] = libc.syscall(248, b"user", b"left_by_a", b"secret", 6, keyring)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # left_by_a"], start_new_session=True)
planted = {}
def attempt(what, action):  # under the grader's own uid these succeed; under a uid of its own they are refused
    try:
        action()
        planted[what] = "done"
    except OSError as exc:
        planted[what] = exc.strerror
package_parent = os.environ["PYTHONPATH"].split(":")[0]
attempt("file in /", lambda: open("/left_by_a", "w").write("secret"))
attempt("folder in /dev", lambda: os.makedirs("/dev/left_by_a/inner"))
attempt("file in /dev", lambda: open("/dev/left_by_a.txt", "w").write("secret"))
attempt("fifo in /", lambda: os.mkfifo("/left_by_a.fifo"))
attempt("socket in /dev", lambda: socket.socket(socket.AF_UNIX).bind("/dev/left_by_a.sock"))
attempt("module on sys.path", lambda: open(os.path.join(package_parent, "left_by_a.py"), "w").write("x = 1"))
attempt("xattr on /", lambda: os.setxattr("/", "user.left_by_a", b"secret"))
attempt("xattr on /tmp", lambda: os.setxattr("/tmp", "user.left_by_a", b"secret"))
attempt("chmod /dev", lambda: os.chmod("/dev", 0o777))
attempt("chmod /", lambda: os.chmod("/", 0o777))
attempt("chmod package parent", lambda: os.chmod(package_parent, 0o777))
attempt("chmod /tmp", lambda: os.chmod("/tmp", 0o700))
attempt("symlink /sbin", lambda: (os.symlink("tmp", "/sbin.new"), os.replace("/sbin.new", "/sbin")))
attempt("mtime of /dev", lambda: os.utime("/dev", (12345, 12345)))
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
attempt("zygote's open files", lambda: resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (64, hard)))
attempt("pid 1's memory", lambda: os.close(os.open("/proc/1/mem", os.O_RDWR)))
zygote = open(f"/proc/{os.getppid()}/stat").read().split()[21]
''' + LOOK + r'''
print("FOUND" + json.dumps({"made": made, "zygote": zygote, "planted": planted, "before": before, "after": look}))
'''

FINDS = LOOK + r'''
import ctypes
def alive(pid):
    try:
        return "left_by_a" in open(f"/proc/{pid}/cmdline").read()
    except OSError:
        return False
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
mounts = {line.split()[4] for line in open("/proc/self/mountinfo")}
def names(folder):  # every name under folder, outside what bubblewrap mounted there (a venv under /tmp, say)
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if os.path.join(root, d) not in mounts]
        found += dirs + files
    return sorted(found)
found = {"tmp": names("/tmp"), "shm": names("/dev/shm"),
         "sysv": [line for kind in ("shm", "sem", "msg") for line in open(f"/proc/sysvipc/{kind}").read().splitlines()[1:]],
         "processes": [p for p in os.listdir("/proc") if p.isdigit() and alive(p)],
         "mq": libc.mq_open(b"/left_by_a", os.O_RDWR, 0, None),
         "zygote": open(f"/proc/{os.getppid()}/stat").read().split()[21],
         "zygote_threads": len(os.listdir(f"/proc/{os.getppid()}/task")),
         # where a task could leave a file outside the emptied folders: bubblewrap's own folders, the packages' parent
         "writable": [p for p in ("/", "/dev", "/etc", *os.environ["PYTHONPATH"].split(":")) if os.access(p, os.W_OK)],
         "look": look}
print("FOUND" + json.dumps(found))
'''

KILLS_WORKER = "\nimport os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"


def reuse(sandbox) -> dict:
    from autograder.authoring.class_builder import reference_source
    from autograder.authoring.course import load_course
    from autograder.grader.runner import IDLE_WORKERS, Task, close_idle_workers, prestart, run_tasks

    exercise = "train_with_accumulation"
    spec = load_course().spec_for_exercise(exercise)
    setup = tuple((f"setup {i}", c) for i, c in enumerate(spec.setup_code))
    answer = reference_source(exercise)
    prestart(sandbox, 1)  # the first student's worker started before its job (as while references are observed)
    started_ahead = [w for _, w in IDLE_WORKERS._idle]
    found = {"started_ahead": len(started_ahead)}
    for student, extra in (("a", LEAVES_BEHIND), ("b", FINDS), ("c", KILLS_WORKER), ("d", FINDS)):
        results, _ = run_tasks([Task(student, exercise, setup + (("your cell", answer + extra),), 120.0, 0)], sandbox)
        result = results[student]
        said = result.output.split("FOUND", 1)[1].splitlines()[0] if "FOUND" in result.output else "{}"
        found[student] = {"status": result.status, "reason": result.reason, "said": json.loads(said),
                          "idle_after": len(IDLE_WORKERS._idle),
                          "on_the_worker_started_ahead": [w for _, w in IDLE_WORKERS._idle] == started_ahead}
    close_idle_workers()
    return found


def family(sandbox) -> dict:
    return {"peak_mib": json.loads(run_in(sandbox, [sys.executable, "-c", FAMILY]))}


def lazy_import(sandbox) -> dict:
    return json.loads(run_in(sandbox, [sys.executable, "-c", LAZY_IMPORT]))


def costs(sandbox) -> dict:
    return {"costs": json.loads(run_in(sandbox, [sys.executable, "-c", COSTS]))}


def epoll(sandbox) -> dict:
    """The victim's ranks while another worker holds a full epoll-watch quota of its own uid."""
    found = {}
    for label, box in (("as made", sandbox), ("one identity", replace(sandbox, uid=None, uids=None, subids=None))):
        with tempfile.TemporaryDirectory(prefix="filler-") as workdir, \
                box.launch([sys.executable, "-c", FILL, "90"], workdir) as launch:
            filler = subprocess.Popen(launch.command, stdout=subprocess.PIPE, text=True, cwd=workdir, env=launch.env,
                                      preexec_fn=launch.preexec, start_new_session=True)
            started = time.monotonic()
            filled = json.loads(filler.stdout.readline() or "{}")
            found[label] = {"filler": filled, "fill_s": round(time.monotonic() - started, 1)}
            try:
                found[label]["victim"] = json.loads(run_in(box, [sys.executable, "-c", VICTIM], timeout=120))
            finally:
                launch.kill_all(filler.pid)
                filler.wait()
    return found


if __name__ == "__main__":
    box = make_sandbox(gpu=False)
    check = {"forbidden": forbidden, "sidechannels": sidechannels, "worker": worker, "family": family, "costs": costs,
             "lazy_import": lazy_import, "reuse": reuse,
             "epoll": epoll}[sys.argv[1]]
    print(json.dumps({"sandbox": box.describe(), "warning": box.warning, "one_identity": box.one_identity,
                      **check(box)}))
