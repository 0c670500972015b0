"""Grader side of the worker protocol: start a (sandboxed) worker, feed it tasks, collect results.

The worker's answers are untrusted data: each line becomes a typed ``TaskResult`` in ``protocol.py`` or
is dropped. The grader keeps its own clock: a task that has not answered within its time limit (plus a
grace period) gets the time-out reason, and the whole sandbox is killed from outside (its cgroup, its
process group, its PID namespace), whatever the task did to the worker inside (stopped it, for example).
If the worker dies mid-way, the task in flight is blamed and a fresh worker takes the remaining tasks,
so one hostile exercise costs only its own points.
"""
import json
import os
import select
import subprocess
import sys
import tempfile
import time

from .protocol import LINE_LIMIT, BadMessage, Task, TaskResult, failed, parse_line
from .sandbox.sandbox import Sandbox

STARTUP_S = 120.0          # python + torch import inside the sandbox, on a busy machine
GRACE_S = 15.0             # the worker's own clean-up after a task, before the grader steps in
BETWEEN_TASKS_S = 60.0     # from one result to the next task's start line

__all__ = ["Task", "TaskResult", "failed", "run_tasks"]


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


def _run_worker(tasks: list[Task], sandbox: Sandbox, as_reference: bool):
    """One worker process over ``tasks``; returns (results, key in flight when it stopped, why, peak KiB)."""
    job = {"as_reference": as_reference, "processes": sandbox.limits.processes,
           "tasks": [t.to_json() for t in tasks]}
    with tempfile.TemporaryDirectory(prefix="grader-work-") as workdir, tempfile.TemporaryFile() as errors:
        read_fd, write_fd = os.pipe()
        argv = [sys.executable, "-m", "autograder.grader.sandbox.worker", "--results-fd", str(write_fd)]
        with sandbox.launch(argv, workdir, reference=as_reference) as launch:
            try:
                proc = subprocess.Popen(
                    launch.command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors,
                    pass_fds=(write_fd,), cwd=workdir, env=launch.env, start_new_session=True,
                    preexec_fn=launch.preexec)
            except (OSError, subprocess.SubprocessError) as exc:
                os.close(read_fd), os.close(write_fd)
                return {}, None, f"The grading worker could not start: {exc}", 0
            os.close(write_fd)
            try:
                proc.stdin.write(json.dumps(job).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                results, in_flight, stopped = _collect(read_fd, {t.key: t for t in tasks})
            finally:
                os.close(read_fd)
                launch.kill_all(proc.pid)
                peak_kib = _reap(proc)
        if stopped == "deadline" and in_flight:
            problem = _timed_out(next(t for t in tasks if t.key == in_flight))
        elif stopped == "deadline":
            problem = "The grading worker did not answer in time (the machine may be overloaded); grade again."
        else:
            problem = ("Your code stopped the grading worker itself (for example by killing its parent process, or "
                       "by using more memory or processes than the grader allows), so this exercise could not be graded.")
        if not results and in_flight is None and stopped != "deadline":
            errors.seek(0)
            tail = errors.read()[-1500:].decode(errors="replace").strip()
            problem = f"The grading worker could not start: {tail or 'no message'}"
    return results, in_flight, problem, peak_kib


def _collect(read_fd: int, tasks: dict[str, Task]) -> tuple[dict[str, TaskResult], str | None, str]:
    """Read result lines until every task has one, the worker stops ("eof"), or the grader's own deadline
    for what should come next passes ("deadline"). Returns (results, key in flight, why it stopped)."""
    results, in_flight, buffer = {}, None, b""
    deadline = time.monotonic() + STARTUP_S
    while len(results) < len(tasks):
        left = deadline - time.monotonic()
        if left <= 0:
            return results, in_flight, "deadline"
        ready, _, _ = select.select([read_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(read_fd, 1 << 16)
        if not chunk or len(buffer) + len(chunk) > LINE_LIMIT:
            return results, in_flight, "eof"
        *lines, buffer = (buffer + chunk).split(b"\n")
        for line in lines:
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
                deadline = time.monotonic() + BETWEEN_TASKS_S
    return results, in_flight, "done"


def _reap(proc: subprocess.Popen) -> int:
    """Collect the worker's exit; returns its peak memory in KiB (the sandbox and every process under it)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss
