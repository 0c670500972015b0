"""The process that runs submitted code and reports plain observations (run it inside the sandbox).

Protocol: see ``messages.py`` (JSON jobs on stdin, one a line; JSON lines on the file descriptor ``--results-fd``).
Only this zygote holds that descriptor: each task's child closes it (and stdin, where the next student's job
will come) before any submitted code runs, so a task can neither forge a result line nor write garbage on it.

Python, torch and the exercise modules are imported once, before any submitted code exists in this
process. Each task then runs in a forked child with its own session: a crash, hang, ``os._exit``, flood
or monkeypatch in one task cannot reach the next one, and the zygote is never running student code.
In a sandbox of its own (bubblewrap) the zygote grades one student's job after another: between two jobs it
kills every other process of the sandbox, empties what outlives a process (its tmpfs, SysV IPC) and puts back what
bubblewrap made as it was before the first task (its / and /dev, the zygote's own limits), and says "ready" only
when all of that is done (``fresh_for_next_job``; docs/grading.md says why that is enough).
"""
import argparse
import ctypes
import importlib
import json
import os
import resource
import select
import signal
import sys
import time

import torch

from ...exercises import all_exercises, get_exercise
from ...exercises.beside.define import DefinitionError, define_function
from ...exercises.beside.observing import observe, observer_of
from ...exercises.beside.ranks import Deferred, rank_fds
from ...exercises.beside.ranks import configure as configure_ranks
from ..messages import BadMessage, Task, loads_bounded
from .hugepages import collapse_anonymous_memory
from .isolation import close_inherited, isolate_rank, rank_outputs
from .kernels import switch_off
from .keyrings import deny_keyrings
from .rank_holdings import RankFamilies, send_tmpfs
from .reset import baseline, fresh_for_next_job
from .scheduling import protect_from_rescheduling

RESULT_LIMIT = 3 << 20       # bytes of observation a task may send back (the grader reads lines of 4 MiB)
OUTPUT_SHOWN = 1500          # characters of a task's printed output kept for feedback
OUTPUT_FILE = "task-output.txt"  # in the worker's own working directory
# What the lessons' setup cells import that neither torch nor the observers do: every rank would import it again
# after its fork (torch.distributed.checkpoint, about 50 ms of CPU per rank of Lesson 9's exercises) otherwise.
PRELOADED = ("torch._dynamo", "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
             "coursekit.failures", "coursekit.kernels", "triton.runtime.interpreter")


def _not_dumpable():
    """PR_SET_DUMPABLE=0: processes of the same uid cannot ptrace us or read /proc/<pid>/fd."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def preload() -> None:
    """Import once here what every task or rank would otherwise import after its fork (``PRELOADED``; dynamo, which
    creating any torch.optim optimizer pulls in, costs seconds per task). A module this machine lacks (triton), or
    that a stub bound over a forbidden library stops, is left to the cell that imports it, as before."""
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001  missing, or switched off in this sandbox: the cells say so themselves
            pass


def _run_task_in_child(task: Task, as_reference: bool, write_fd: int, results_fd: int) -> None:
    """Child side: define the function from the cells, observe it, send JSON, exit. Never returns.

    For a rank exercise this process runs no student code at all: it forks the ranks, which define the function,
    and measures them from outside (exercises/beside/ranks.py, meter.py)."""
    status = 0
    try:
        os.close(results_fd)  # the zygote's channel to the grader: submitted code never holds it
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0), os.close(null)  # nor the grader's channel to the zygote (the next students' jobs)
        os.setsid()
        out = os.open(OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1), os.dup2(out, 2)
        os.close(out)  # open in every rank otherwise: a file they could share through /proc/self/fd
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        exercise = get_exercise(task.exercise)
        if exercise.ranks:
            # A rank exercise: this process only launches and measures; each rank defines the student's function
            # itself, and never holds this process's channel to the zygote.
            kernels = () if as_reference else getattr(observer_of(exercise), "FORBIDDEN_KERNELS", ())
            _configure_ranks(write_fd, kernels, share_files=exercise.ranks_share_files)
            fn = Deferred(list(task.cells), task.exercise)
        else:
            try:
                fn = define_function(list(task.cells), task.exercise)
            except DefinitionError as exc:
                fn = None
                message = {"status": "failed", "reason": str(exc)}
        if fn is not None:
            message = {"status": "ok", "observation": observe(exercise, fn, salt=task.salt, as_reference=as_reference)}
        payload = json.dumps(message).encode()
    except BaseException as exc:  # whatever the submitted code raised or did to the interpreter
        payload = json.dumps({"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:400]}).encode()
        status = 1
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view):]
    finally:
        os._exit(status)


def _configure_ranks(write_fd: int, kernels: tuple[tuple[str, str], ...] = (), share_files: bool = False) -> None:
    """What every rank does first, and how the launcher counts their memory, in a sandbox of its own (the
    student's own kernel, in a self-check, does neither): no channel to the zygote and no other inherited descriptor,
    isolated from the other ranks (isolation.py) unless the exercise's ranks share files (``share_files``:
    ``Exercise.ranks_share_files``, decided here, before any submitted code), unable to reschedule the launcher
    (scheduling.py); memory counted over every process a rank starts (rank_holdings.py); the exercise's forbidden
    torch kernels switched off (kernels.py)."""
    tmp_bytes = None if share_files else os.environ.get("AUTOGRADER_ISOLATE_RANKS")
    measuring = [os.getpid(), os.getppid()]  # this launcher and the zygote: no rank may change their scheduling

    sandboxed = bool(os.environ.get("AUTOGRADER_OWN_PID_NAMESPACE"))  # and a network namespace of its own
    families = RankFamilies(os.getpid(), os.getppid()) if sandboxed else None
    # Each isolated rank hands the launcher its private tmpfs before any submitted code: what it parks there is
    # counted whatever it does later (undumpable, its /proc/<pid>/root is unreadable; issue 37).
    outbox = families.tmpfs_channel() if families and tmp_bytes else None

    def setup():
        os.close(write_fd)
        if tmp_bytes:
            isolate_rank(int(tmp_bytes), keep_fds=rank_fds() | ({outbox.fileno()} if outbox else set()))
            if outbox:
                send_tmpfs(outbox)
        else:
            close_inherited(rank_fds())
        protect_from_rescheduling(measuring)
        switch_off(kernels)

    configure_ranks(child_setup=setup, held=families.held if families else None, private_network=sandboxed)


def _collect_child(pid: int, fd: int, deadline: float, limit: int) -> tuple[bytes, int | None]:
    """Read the child's result until it exits (or the deadline); returns (data, wait status or None).

    We stop at the child's exit, not at end-of-file: a grandchild it left running may still hold the pipe.
    """
    chunks, size, status = [], 0, None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.02)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                size += len(chunk)
                if size <= limit:
                    chunks.append(chunk)
                continue
        if status is None:
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                status = wait_status
                continue  # drain what it wrote before exiting
        if status is not None or (ready and not chunk):
            break
    return b"".join(chunks), status


def _wait_until(pid: int, deadline: float) -> int | None:
    """waitpid with a deadline; None if the child is still running."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.01)


def _stop_everything_but_me(pid: int) -> None:
    """Kill the task's session, and in our own PID namespace every process left behind."""
    for target in (lambda: os.killpg(pid, signal.SIGKILL),
                   (lambda: os.kill(-1, signal.SIGKILL)) if os.environ.get("AUTOGRADER_OWN_PID_NAMESPACE") else None):
        if target:
            try:
                target()
            except (ProcessLookupError, PermissionError):
                pass


def _reap_orphans() -> None:
    """Under one identity the zygote is its PID namespace's init (launch.py): what a task left running and the kill
    ended is its zombie until reaped, and would count against the next task's process limit."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _why_no_result(wait_status: int | None, timed_out: bool, timeout: float) -> str:
    if timed_out:
        return f"Your code did not finish within {timeout:g} s (an endless loop, or a rank waiting for a collective?)."
    if wait_status is None:
        return "Your code stopped without a result."
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        return {
            signal.SIGXFSZ: "Your code wrote more output than the grader allows (output limit exceeded).",
            signal.SIGKILL: "Your code was killed (most often: it used more memory than the grader allows).",
            signal.SIGSEGV: "Your code crashed the Python interpreter (segmentation fault).",
        }.get(sig, f"Your code was stopped by signal {signal.Signals(sig).name}.")
    return f"Your code ended the process (exit code {os.WEXITSTATUS(wait_status)}) before a result was ready."


def _output_tail() -> str:
    """What the task printed, then what each of its ranks printed (each rank writes a file of its own: isolation.py);
    the ranks' files are removed."""
    shown = b""
    for path in [OUTPUT_FILE, *rank_outputs()]:
        try:
            with open(path, "rb") as f:
                shown += f.read(max(0, OUTPUT_SHOWN - len(shown)))
        except OSError:
            pass
        if path != OUTPUT_FILE:
            try:
                os.unlink(path)
            except OSError:
                pass
    return shown.decode(errors="replace")


def run_task(task: Task, as_reference: bool, results_fd: int) -> dict:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _run_task_in_child(task, as_reference, write_fd, results_fd)
    os.close(write_fd)
    timeout = float(task.timeout)
    data, wait_status = _collect_child(pid, read_fd, time.monotonic() + timeout, RESULT_LIMIT)
    os.close(read_fd)
    if wait_status is None:  # end-of-file came just before the exit, or the deadline passed
        wait_status = _wait_until(pid, time.monotonic() + 0.5)
    timed_out = wait_status is None
    _stop_everything_but_me(pid)  # the task's session, and any grandchild it left running
    if timed_out:
        _, wait_status = os.waitpid(pid, 0)
    result = {"key": task.key, "output": _output_tail()}
    try:  # the child's payload is shaped by submitted code: bounded before anything reads it
        message = loads_bounded(data, limit=RESULT_LIMIT) if data and not timed_out else None
    except BadMessage as problem:
        message = {"status": "failed", "reason": f"The result your code produced could not be read ({problem})."}
    if isinstance(message, dict) and message.get("status") == "ok" and isinstance(message.get("observation"), dict):
        result.update(status="ok", observation=message["observation"], reason="")
    elif isinstance(message, dict) and message.get("status") == "failed":
        result.update(status="failed", observation=None, reason=str(message.get("reason", ""))[:2000])
    else:
        result.update(status="failed", observation=None,
                      reason=_why_no_result(None if timed_out else wait_status, timed_out, timeout))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results-fd", type=int, required=True)
    parser.add_argument("--processes", type=int, default=0, help="RLIMIT_NPROC inside the sandbox (0: as it is)")
    args = parser.parse_args()
    if args.processes:
        # Set here, not before the sandbox starts: inside bubblewrap's user namespace (an unprivileged
        # grader) the count is then this sandbox's own, not shared by every worker of the grader's uid.
        _, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        limit = args.processes if hard == resource.RLIM_INFINITY else min(args.processes, hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    # No POSIX message queue at all: the one IPC object that outlives its processes and that the zygote could not
    # list to remove between two students' jobs (it has no mqueue file system). Nothing the course uses needs one.
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    torch.set_num_threads(1)  # forked children (and their ranks) must not inherit a busy OpenMP pool
    # Everything is imported before the first job is read: a worker started ahead of its first student
    # (runner.prestart) spends its start-up while the grader is busy with something else.
    for exercise in all_exercises().values():  # imported once here, not after each task's fork
        observer_of(exercise)
    preload()
    collapse_anonymous_memory()  # every task and rank is forked from here: forks and exits cost far less then
    _not_dumpable()
    keys_denied = deny_keyrings()
    results = os.fdopen(args.results_fd, "w", buffering=1)
    own_sandbox = bool(os.environ.get("AUTOGRADER_OWN_PID_NAMESPACE"))
    before = baseline() if own_sandbox else None  # before any submitted code: what the sweep puts back
    jobs = sys.stdin.buffer
    line = jobs.readline()
    job = json.loads(line) if line.strip() else None
    while job:
        for raw in job["tasks"]:
            task = Task.from_json(raw)
            results.write(json.dumps({"key": task.key, "event": "start"}) + "\n")
            results.write(json.dumps(run_task(task, bool(job.get("as_reference")), args.results_fd)) + "\n")
            _reap_orphans()
        if not (own_sandbox and keys_denied and fresh_for_next_job(before=before)):
            return  # the grader starts a fresh sandbox for the next student
        peak = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        results.write(json.dumps({"event": "ready", "peak_kib": peak}) + "\n")
        line = jobs.readline()
        job = json.loads(line) if line.strip() else None


if __name__ == "__main__":
    main()
