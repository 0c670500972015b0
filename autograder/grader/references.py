"""The reference solutions' observations a class is judged against, and the held-out scenarios they are made on."""
import hashlib
from concurrent.futures import ThreadPoolExecutor

from ..authoring.course import Course
from ..exercises import get_exercise
from .isolation import by_worker
from .runner import Task, run_tasks
from .sandbox.launch import Sandbox


def held_out_salt(course: Course, exercise: str) -> int:
    """The salt of the held-out scenarios an exercise is graded on: derived from its solution and setup cells,
    which never leave the instructor's repository, so it is the same run after run and changes with the
    solution. (Knowing it would not help a student: a scenario's answer still takes the real computation.)"""
    from ..selfcheck.recorded import canonical

    spec = course.spec_for_exercise(exercise)
    digest = hashlib.sha256(b"held-out scenarios\0" + canonical(spec.setup_code + [spec.reference_code[exercise]]))
    return int.from_bytes(digest.digest()[:4], "big") % (2**31 - 1) + 1


def reference_observations(course: Course, exercises: list[str], sandbox: Sandbox,
                           salt: int | None = None, jobs: int = 1) -> dict[str, dict]:
    """Observe every reference solution once, in the same kind of worker as the students' code: on each
    exercise's held-out scenarios (``salt=None``, class grading) or on those of the given salt (0: public). The
    kinds of worker run side by side, up to ``jobs`` at once (as the students' workers will)."""
    tasks = [Task(e, e, tuple(course.reference_cells(e)), max(get_exercise(e).timeout_s, 120),
                  held_out_salt(course, e) if salt is None else salt) for e in exercises]
    groups = list(by_worker(tasks, sandbox))  # as the students' are; a reference's worker keeps every library
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(groups)))) as pool:
        found = pool.map(lambda group: run_tasks(group[0], group[1], as_reference=True)[0], groups)
    results = {k: r for part in found for k, r in part.items()}
    broken = {k: r.reason for k, r in results.items() if r.status != "ok"}
    if broken:
        raise RuntimeError(f"the reference solutions could not be observed: {broken}")
    return {k: r.observation for k, r in results.items()}
