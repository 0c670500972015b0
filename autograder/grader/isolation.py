"""Which worker runs which of a student's tasks: the isolation policy.

An exercise that needs a library the others forbid gets a worker of its own; where every worker shares the grader's
identity, rank exercises run while no other student's worker does."""
import threading
from contextlib import contextmanager

from ..exercises import get_exercise
from .runner import Task, run_tasks
from .sandbox.launch import Sandbox


class AloneOrShared:
    """Workers that start ranks run alone; the others run side by side. A per-user quota (epoll watches, ...) that
    one student's code fills makes gloo fail in every rank of the same uid, so under one identity no other
    student's worker may be alive while ranks run. Waiting "alone" workers go first."""

    def __init__(self):
        self._changed = threading.Condition()
        self._shared = self._waiting = 0
        self._alone = False

    @contextmanager
    def shared(self):
        with self._changed:
            self._changed.wait_for(lambda: not self._alone and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            with self._changed:
                self._shared -= 1
                self._changed.notify_all()

    @contextmanager
    def alone(self):
        with self._changed:
            self._waiting += 1
            self._changed.wait_for(lambda: not self._alone and not self._shared)
            self._waiting -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()


RANK_EXERCISES_ALONE = AloneOrShared()


def by_worker(tasks: list[Task], sandbox: Sandbox):
    """``(tasks, sandbox)`` per kind of worker the tasks need: exercises that need a library the others forbid
    (``Exercise.needs_libraries``) get a worker of their own in which those libraries alone are in place; every
    other one the sandbox as it is. (Whether a rank exercise's ranks share files, ``Exercise.ranks_share_files``, is
    decided per task by the worker's launcher, before any submitted code: it needs no worker of its own.)"""
    def needs(task: Task) -> tuple[str, ...]:
        return get_exercise(task.exercise).needs_libraries

    for libraries in sorted({needs(t) for t in tasks}):
        yield [t for t in tasks if needs(t) == libraries], sandbox.allowing(libraries)


def worker_kinds(exercises: list[str], sandbox: Sandbox) -> list[Sandbox]:
    """The sandbox of each kind of worker a student's ``exercises`` need (``by_worker``)."""
    return [made for _, made in by_worker([Task(e, e, (), 0.0) for e in exercises], sandbox)]


def run_isolated(tasks: list[Task], sandbox: Sandbox) -> tuple[dict, float]:
    """One student's tasks in one worker per kind they need (``by_worker``)."""
    results, peak_mib = {}, 0.0
    for group, made in by_worker(tasks, sandbox):
        more, peak = _run_in_one_worker(group, made)
        results, peak_mib = {**results, **more}, max(peak_mib, peak)
    return results, peak_mib


def _run_in_one_worker(tasks: list[Task], sandbox: Sandbox) -> tuple[dict, float]:
    """Where every worker shares the grader's identity, the rank exercises in a worker of their own that runs while
    no other worker does (``Sandbox.one_identity``). A worker kept for the next student (runner.IDLE_WORKERS) runs
    nothing while it waits: its sweep killed and reaped every process of the student before, and with them the
    watches they held, before it said "ready" (the zygote itself holds pipes and no watch), so no canary run is
    needed before blaming a student's code for a gloo failure."""
    if not sandbox.one_identity:
        return run_tasks(tasks, sandbox)
    ranked = [t for t in tasks if get_exercise(t.exercise).ranks]
    results, peak_mib = {}, 0.0
    if len(ranked) < len(tasks):
        with RANK_EXERCISES_ALONE.shared():
            results, peak_mib = run_tasks([t for t in tasks if t not in ranked], sandbox)
    if ranked:
        with RANK_EXERCISES_ALONE.alone():
            more, peak = run_tasks(ranked, sandbox)
        results, peak_mib = {**results, **more}, max(peak_mib, peak)
    return results, peak_mib
