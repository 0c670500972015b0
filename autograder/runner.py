"""Grader side of the worker protocol: start a (sandboxed) worker, feed it tasks, collect results.

The worker's answers are treated as untrusted data: only known keys, known statuses and JSON objects
are accepted. If the worker dies mid-way (submitted code killed it), the task in flight is blamed and
a fresh worker takes the remaining tasks, so one hostile exercise costs only its own points.
"""
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from .sandbox import Sandbox, worker_env

STARTUP_S = 120.0          # python + torch import inside the sandbox, on a busy machine
LINE_LIMIT = 40 << 20      # bytes of one result line


@dataclass(frozen=True)
class Task:
    key: str                          # unique within one run, e.g. "01_x.ipynb::train_with_accumulation"
    exercise: str
    cells: tuple[tuple[str, str], ...]
    timeout: float


def failed(key: str, reason: str, output: str = "") -> dict:
    return {"key": key, "status": "failed", "observation": None, "reason": reason, "output": output}


def run_tasks(tasks: list[Task], sandbox: Sandbox, *, as_reference: bool = False) -> tuple[dict[str, dict], float]:
    """Run every task; returns ``{key: result}`` with a result for every task, whatever happens, and the
    workers' peak memory (MiB, largest process)."""
    results: dict[str, dict] = {}
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


def _parse_result(line: bytes, keys: set[str]) -> dict | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("key") not in keys:
        return None
    if message.get("event") == "start":
        return message
    if message.get("status") not in ("ok", "failed"):
        return None
    observation = message.get("observation")
    if message["status"] == "ok" and not isinstance(observation, dict):
        return None
    return {"key": message["key"], "status": message["status"], "observation": observation,
            "reason": str(message.get("reason", ""))[:600], "output": str(message.get("output", ""))[:2000]}


def _run_worker(tasks: list[Task], sandbox: Sandbox, as_reference: bool):
    """One worker process over ``tasks``; returns (results, key in flight when it stopped, why)."""
    job = {"as_reference": as_reference,
           "tasks": [{"key": t.key, "exercise": t.exercise, "cells": [list(c) for c in t.cells],
                      "timeout": t.timeout} for t in tasks]}
    deadline = time.monotonic() + STARTUP_S + sum(t.timeout + 10 for t in tasks)
    with tempfile.TemporaryDirectory(prefix="grader-work-") as workdir, tempfile.TemporaryFile() as errors:
        read_fd, write_fd = os.pipe()
        argv = [sys.executable, "-m", "autograder.worker", "--results-fd", str(write_fd)]
        with sandbox.worker_command(argv) as command:
            proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors,
                pass_fds=(write_fd,), cwd=workdir, env=worker_env(sandbox, workdir), start_new_session=True,
                preexec_fn=sandbox.limits.apply if sandbox.mode != "off" else None)
            os.close(write_fd)
            try:
                proc.stdin.write(json.dumps(job).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                results, in_flight = _collect(read_fd, {t.key for t in tasks}, deadline)
            finally:
                os.close(read_fd)
                peak_kib = _stop(proc)
        problem = ("Your code stopped the grading worker itself (for example by killing its parent process), "
                   "so this exercise could not be graded.")
        if not results and in_flight is None:
            errors.seek(0)
            tail = errors.read()[-1500:].decode(errors="replace").strip()
            problem = f"The grading worker could not start: {tail or 'no message'}"
    return results, in_flight, problem, peak_kib


def _collect(read_fd: int, keys: set[str], deadline: float) -> tuple[dict, str | None]:
    """Read result lines until every key has one, the worker stops, or the deadline passes."""
    results, in_flight, buffer = {}, None, b""
    while len(results) < len(keys):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([read_fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(read_fd, 1 << 16)
        if not chunk or len(buffer) + len(chunk) > LINE_LIMIT:
            break
        *lines, buffer = (buffer + chunk).split(b"\n")
        for line in lines:
            message = _parse_result(line, keys)
            if message is None:
                continue
            if message.get("event") == "start":
                in_flight = message["key"]
            else:
                results[message["key"]] = message
                in_flight = None
    return results, in_flight


def _stop(proc: subprocess.Popen) -> int:
    """End the worker and everything it started (its own session); returns its peak memory in KiB."""
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    _, status, usage = os.wait4(proc.pid, 0)  # the rusage of the sandbox and every process under it
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss
