"""Grader side of the worker protocol: start a (sandboxed) worker, feed it tasks, collect results.

The worker's answers are untrusted data: each line becomes a typed ``TaskResult`` in ``messages.py`` or
is dropped. The grader keeps its own clock: a task that has not answered within its time limit (plus a
grace period) gets the time-out reason, and the whole sandbox is killed from outside (its cgroup, its
process group, its PID namespace), whatever the task did to the worker inside (stopped it, for example).
If the worker dies mid-way, the task in flight is blamed and a fresh worker takes the remaining tasks,
so one hostile exercise costs only its own points. A worker whose job ended with every result and its "ready" waits
for the next student's job of the same kind of sandbox (``IDLE_WORKERS``; ``close_idle_workers`` at the end).
"""
import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack

from .messages import LINE_LIMIT, BadMessage, Task, TaskResult, failed, parse_line, parse_ready
from .sandbox.launch import Sandbox

STARTUP_S = 120.0          # python + torch import inside the sandbox, on a busy machine
GRACE_S = 15.0             # the worker's own clean-up after a task, before the grader steps in
BETWEEN_TASKS_S = 60.0     # from one result to the next task's start line
READY_S = 30.0             # from a job's last result to the worker's "ready" for the next student

__all__ = ["Task", "TaskResult", "close_idle_workers", "failed", "keep_idle_workers", "prestart", "run_tasks"]


def _timed_out(task: Task) -> str:
    return (f"Your code did not finish within {task.timeout:g} s (an endless loop, or a rank waiting for a "
            "collective?); the grader stopped it.")


def run_tasks(tasks: list[Task], sandbox: Sandbox, *, as_reference: bool = False) -> tuple[dict[str, TaskResult], float]:
    """Run every task; returns ``{key: result}`` with a result for every task, whatever happens, and the
    workers' peak memory (MiB, largest process)."""
    results: dict[str, TaskResult] = {}
    peak_mib = 0.0
    remaining = list(tasks)
    while remaining:
        got, in_flight, problem, peak_kib = _run_worker(remaining, sandbox, as_reference)
        peak_mib = max(peak_mib, peak_kib / 1024)
        results.update(got)
        remaining = [t for t in remaining if t.key not in results]
        if remaining:
            victim = in_flight or remaining[0].key
            results[victim] = failed(victim, problem)
            remaining = [t for t in remaining if t.key != victim]
    return results, peak_mib


class _Worker:
    """A started worker: its process, how it was launched (uid, cgroup: held until ``stop``), its pipes."""

    def __init__(self, sandbox: Sandbox, as_reference: bool):
        self.stack = ExitStack()
        workdir = self.stack.enter_context(tempfile.TemporaryDirectory(prefix="grader-work-"))
        self.errors = self.stack.enter_context(tempfile.TemporaryFile())
        self.read_fd, write_fd = os.pipe()
        self.stack.callback(os.close, self.read_fd)
        try:
            self.launch = self.stack.enter_context(sandbox.launch(
                [sys.executable, "-m", "autograder.grader.sandbox.worker", "--results-fd", str(write_fd),
                 "--processes", str(sandbox.limits.processes)], workdir,
                reference=as_reference, zygote=True))
            self.proc = subprocess.Popen(
                self.launch.command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self.errors,
                pass_fds=(write_fd,), cwd=workdir, env=self.launch.env, start_new_session=True,
                preexec_fn=self.launch.preexec)
        except BaseException:
            self.stack.close()
            raise
        finally:
            os.close(write_fd)
        self.buffer, self.peak_kib, self.jobs = b"", 0, 0

    def send(self, job: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(job).encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass
        self.jobs += 1

    def error_tail(self) -> str:
        self.errors.seek(0)
        return self.errors.read()[-1500:].decode(errors="replace").strip()

    def stop(self) -> int:
        """Kill everything the worker started, reap it; returns its peak memory in KiB."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.launch.kill_all(self.proc.pid)
        peak = _reap(self.proc)
        self.stack.close()
        return max(peak, self.peak_kib)


class _IdleWorkers:
    """Workers of sandboxes of their own that finished a student's job and said they are fresh for the next one
    (worker.py, reset.py): the next student of the same kind of sandbox is graded there, without the seconds of
    starting Python and importing torch again. At most ``limit`` wait; the oldest is stopped first."""

    def __init__(self, limit: int):
        self.limit, self._idle, self._lock = limit, [], threading.Lock()

    def take(self, kind) -> "_Worker | None":
        with self._lock:
            for i, (k, _) in enumerate(self._idle):
                if k == kind:
                    return self._idle.pop(i)[1]
        return None

    def give(self, kind, worker: _Worker) -> None:
        with self._lock:
            self._idle.append((kind, worker))
            extra, self._idle = self._idle[:-self.limit], self._idle[-self.limit:]
        for _, old in extra:
            old.stop()

    def close(self) -> None:
        """Stop every idle worker (the end of a class, or of the grader's process)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for _, worker in idle:
            worker.stop()


IDLE_WORKERS = _IdleWorkers(limit=max(2, os.cpu_count() or 1))
atexit.register(IDLE_WORKERS.close)


def keep_idle_workers(limit: int) -> None:
    """How many workers may wait for another student (the oldest is stopped first)."""
    IDLE_WORKERS.limit = max(1, limit)


def close_idle_workers() -> None:
    """Stop the workers waiting for another student (the end of a class)."""
    IDLE_WORKERS.close()


def prestart(sandbox: Sandbox, count: int) -> None:
    """Start ``count`` students' workers of this kind of sandbox now, idle until a student's job takes one: a worker
    imports everything before it reads its first job, so its start-up (seconds) runs while the grader does something
    else (the references). Only where a worker can be kept (``_reusable``); one that cannot start is left for
    ``_run_worker`` to start again, and to report."""
    kind = _reusable(sandbox, as_reference=False)
    for _ in range(count if kind else 0):
        try:
            IDLE_WORKERS.give(kind, _Worker(sandbox, as_reference=False))
        except (OSError, subprocess.SubprocessError):
            return


def _reusable(sandbox: Sandbox, as_reference: bool):
    """The kind of sandbox a worker can be reused for, or None: only a bubblewrap sandbox (its own PID, IPC and mount
    namespaces, which the zygote sweeps between jobs: under the grader's own uid, bubblewrap's / and /dev too), and
    never the reference's (it keeps forbidden libraries)."""
    if sandbox.mode != "bubblewrap" or as_reference:
        return None
    return sandbox.fingerprint(), tuple(sandbox.stubs.args())


def _run_worker(tasks: list[Task], sandbox: Sandbox, as_reference: bool, reuse: bool = True):
    """One worker process over ``tasks`` (an idle one of the same kind of sandbox, else a fresh one); returns
    (results, key in flight when it stopped, why, peak KiB)."""
    job = {"as_reference": as_reference, "tasks": [t.to_json() for t in tasks]}
    kind = _reusable(sandbox, as_reference)
    worker = IDLE_WORKERS.take(kind) if kind and reuse else None
    if worker is None:
        try:
            worker = _Worker(sandbox, as_reference)
        except (OSError, subprocess.SubprocessError) as exc:
            return {}, None, f"The grading worker could not start: {exc}", 0
    worker.send(job)
    first_job = worker.jobs == 1
    try:
        results, in_flight, stopped = _collect(worker, {t.key: t for t in tasks}, until_ready=kind is not None)
    except BaseException:
        worker.stop()
        raise
    if stopped == "ready":
        IDLE_WORKERS.give(kind, worker)
        return results, None, "", worker.peak_kib
    could_not_start = first_job and not results and in_flight is None and stopped != "deadline"
    why_not = worker.error_tail() if could_not_start else ""
    peak_kib = worker.stop()
    if not first_job and not results and in_flight is None:  # it went away while idle: no task is to blame
        return _run_worker(tasks, sandbox, as_reference, reuse=False)
    if could_not_start:
        problem = f"The grading worker could not start: {why_not or 'no message'}"
    elif stopped == "deadline" and in_flight:
        problem = _timed_out(next(t for t in tasks if t.key == in_flight))
    elif stopped == "deadline":
        problem = "The grading worker did not answer in time (the machine may be overloaded); grade again."
    else:
        problem = ("Your code stopped the grading worker itself (for example by killing its parent process, or "
                   "by using more memory or processes than the grader allows), so this exercise could not be graded.")
    return results, in_flight, problem, peak_kib


def _collect(worker: _Worker, tasks: dict[str, Task], until_ready: bool) -> tuple[dict[str, TaskResult], str | None, str]:
    """Read result lines until every task has one (and, ``until_ready``, the worker says it is fresh for the next
    job: "ready"), the worker stops ("eof"), or the grader's own deadline for what should come next passes
    ("deadline"). Returns (results, key in flight, why it stopped: "done", "ready", "eof" or "deadline")."""
    results, in_flight = {}, None
    deadline = time.monotonic() + (STARTUP_S if worker.jobs == 1 else BETWEEN_TASKS_S)
    while True:
        if len(results) == len(tasks) and not until_ready:
            return results, None, "done"
        left = deadline - time.monotonic()
        if left <= 0:
            return results, in_flight, "done" if len(results) == len(tasks) else "deadline"
        ready, _, _ = select.select([worker.read_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(worker.read_fd, 1 << 16)
        if not chunk or len(worker.buffer) + len(chunk) > LINE_LIMIT:
            return results, in_flight, "done" if len(results) == len(tasks) else "eof"
        *lines, worker.buffer = (worker.buffer + chunk).split(b"\n")
        for line in lines:
            if len(results) == len(tasks):
                if not until_ready:  # a "ready" in the same read as the last result: this worker is not kept
                    return results, None, "done"
                if (peak := parse_ready(line)) is not None:
                    worker.peak_kib = max(worker.peak_kib, peak)
                    return results, None, "ready"
                continue
            try:
                message = parse_line(line, set(tasks) - set(results))
            except BadMessage:
                continue
            if isinstance(message, str):  # a task starts: the grader's clock for it starts too
                in_flight = message
                deadline = time.monotonic() + tasks[message].timeout + GRACE_S
            else:
                results[message.key] = message
                in_flight = None
                deadline = time.monotonic() + (READY_S if len(results) == len(tasks) else BETWEEN_TASKS_S)


def _reap(proc: subprocess.Popen) -> int:
    """Collect the worker's exit; returns its peak memory in KiB (the sandbox and every process under it)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss
