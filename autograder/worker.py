"""The process that runs submitted code and reports plain observations (run it inside the sandbox).

Protocol. The grader writes one JSON job to stdin::

    {"as_reference": false,
     "tasks": [{"key": "01_x.ipynb::train_with_accumulation", "exercise": "train_with_accumulation",
                "cells": [["setup cell", "import torch"], ["your cell", "def ..."]], "timeout": 60}]}

and reads JSON lines from the file descriptor given by ``--results-fd``: a ``{"key", "event": "start"}``
line before each task, then ``{"key", "status": "ok"|"failed", "observation", "reason", "output"}``.

Python, torch and the exercise modules are imported once, before any submitted code exists in this
process. Each task then runs in a forked child with its own session: a crash, hang, ``os._exit``, flood
or monkeypatch in one task cannot reach the next one, and the zygote is never running student code.
"""
import argparse
import ctypes
import importlib
import json
import os
import select
import signal
import sys
import time

import torch

from .define import DefinitionError, define_function
from .exercises import all_exercises, get_exercise

RESULT_LIMIT = 32 << 20      # bytes of observation a task may send back
OUTPUT_SHOWN = 1500          # characters of a task's printed output kept for feedback
OUTPUT_FILE = "task-output.txt"  # in the worker's own working directory


def _not_dumpable():
    """PR_SET_DUMPABLE=0: processes of the same uid cannot ptrace us or read /proc/<pid>/fd."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _run_task_in_child(task: dict, as_reference: bool, write_fd: int) -> None:
    """Child side: define the function from the cells, observe it, send JSON, exit. Never returns."""
    status = 0
    try:
        os.setsid()
        out = os.open(OUTPUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1), os.dup2(out, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        exercise = get_exercise(task["exercise"])
        try:
            fn = define_function([tuple(c) for c in task["cells"]], task["exercise"])
        except DefinitionError as exc:
            message = {"status": "failed", "reason": str(exc)}
        else:
            observe = exercise.observe_as_reference if as_reference else exercise.observe
            message = {"status": "ok", "observation": observe(fn)}
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
    try:
        with open(OUTPUT_FILE, "rb") as f:
            return f.read(OUTPUT_SHOWN).decode(errors="replace")
    except OSError:
        return ""


def run_task(task: dict, as_reference: bool) -> dict:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _run_task_in_child(task, as_reference, write_fd)
    os.close(write_fd)
    timeout = float(task["timeout"])
    data, wait_status = _collect_child(pid, read_fd, time.monotonic() + timeout, RESULT_LIMIT)
    os.close(read_fd)
    if wait_status is None:  # end-of-file came just before the exit, or the deadline passed
        wait_status = _wait_until(pid, time.monotonic() + 0.5)
    timed_out = wait_status is None
    _stop_everything_but_me(pid)  # the task's session, and any grandchild it left running
    if timed_out:
        _, wait_status = os.waitpid(pid, 0)
    result = {"key": task["key"], "output": _output_tail()}
    try:
        message = json.loads(data) if data and len(data) <= RESULT_LIMIT and not timed_out else None
    except ValueError:
        message = None
    if isinstance(message, dict) and message.get("status") in ("ok", "failed"):
        result.update(status=message["status"], observation=message.get("observation"),
                      reason=str(message.get("reason", "")))
    else:
        result.update(status="failed", observation=None,
                      reason=_why_no_result(None if timed_out else wait_status, timed_out, timeout))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results-fd", type=int, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)  # forked children (and their ranks) must not inherit a busy OpenMP pool
    # Import once here what every task would otherwise import after its fork: the exercise modules, and
    # torch._dynamo, which creating any torch.optim optimizer pulls in (seconds per task otherwise).
    all_exercises()
    importlib.import_module("torch._dynamo")
    _not_dumpable()
    job = json.loads(sys.stdin.read())
    sys.stdin.close()
    results = os.fdopen(args.results_fd, "w", buffering=1)
    for task in job["tasks"]:
        results.write(json.dumps({"key": task["key"], "event": "start"}) + "\n")
        results.write(json.dumps(run_task(task, bool(job.get("as_reference")))) + "\n")


if __name__ == "__main__":
    main()
