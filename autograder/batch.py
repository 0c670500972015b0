"""Grade a whole class: discover, observe the references, grade students in parallel, write reports.

Nothing lost, repeatable: each finished student is saved at once under ``OUT/.state`` (atomically), so an
interrupted run resumes without regrading them; the reports are rebuilt from those saves, sorted, so
the same submissions give the same files.
"""
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from .course import Course, load_course
from .grading import Row, grade_submission, reference_observations
from .report import write_atomic, write_reports
from .sandbox import Sandbox
from .submissions import Submission, discover, match_notebooks


@dataclass
class BatchSummary:
    students: int = 0
    graded: int = 0            # students whose every exercise ran (whatever the score)
    with_problems: int = 0     # students with at least one exercise that could not run
    resumed: int = 0           # students taken from an earlier, interrupted run
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)
    isolation: str = ""
    gradebook: str = ""        # where scores were recorded for nbgrader's tools, if asked

    def line(self) -> str:
        return (f"{self.students} students: {self.graded} fully graded, {self.with_problems} with ungradable "
                f"exercises (reasons in grades.csv), {self.resumed} resumed; {self.seconds:.1f} s; isolation: "
                f"{self.isolation}")


def _grader_version(references: dict) -> str:
    """Changes when the grader's code or the reference results change: then earlier saves are stale."""
    digest = hashlib.sha256(json.dumps(references, sort_keys=True).encode())
    for source in sorted(Path(__file__).parent.rglob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def _wanted_notebooks(submissions: list[Submission], course: Course) -> list[str]:
    """The notebooks anyone submitted (matched by name or content); every student gets rows for all of them."""
    everything = list(course.notebooks)
    seen = set()
    for sub in submissions:
        seen |= {name for name, (path, _) in match_notebooks(sub, course, everything).items() if path}
    return [n for n in everything if n in seen] or everything


def grade_class(submissions_path: Path, out: Path, sandbox: Sandbox, *, jobs: int | None = None,
                timeout: float | None = None, dask_address: str | None = None, progress: bool = True,
                notebooks: list[str] | None = None, gradebook: bool = False) -> tuple[list[Row], BatchSummary]:
    started = time.perf_counter()
    course = load_course()
    submissions = discover(Path(submissions_path), course)
    wanted = notebooks or _wanted_notebooks(submissions, course)
    exercises = [e for n in wanted for e in course.notebooks[n].exercises]
    references = reference_observations(course, exercises, sandbox)
    reference_s = time.perf_counter() - started
    state = out / ".state"
    version = _grader_version(references)
    summary = BatchSummary(students=len(submissions), isolation=sandbox.describe())
    rows_by_student: dict[str, list[Row]] = {}
    todo = []
    for sub in submissions:
        saved = _load_state(state, sub, version, wanted)
        if saved is not None:
            rows_by_student[sub.student] = saved
            summary.resumed += 1
        else:
            todo.append(sub)

    phases = {"reference_s": reference_s, "parse_s": 0.0, "run_s": 0.0, "verdict_s": 0.0, "worker_peak_mib": 0.0}
    bar = tqdm(total=len(todo), desc="grading", unit="student", disable=not progress)
    for sub, (rows, timings) in _grade_all(todo, course, wanted, references, sandbox, timeout, jobs, dask_address):
        _save_state(state, sub, version, wanted, rows)
        rows_by_student[sub.student] = rows
        for key, value in timings.items():
            phases[key] = max(phases[key], value) if key == "worker_peak_mib" else phases[key] + value
        bar.update()
    bar.close()

    all_rows = [r for student in sorted(rows_by_student) for r in rows_by_student[student]]
    write_reports(out, all_rows, exercises)
    if gradebook:
        from .gradebook import record_in_gradebook

        summary.gradebook = record_in_gradebook(all_rows, submissions, course)
    summary.graded = sum(all(r.graded for r in rows) for rows in rows_by_student.values())
    summary.with_problems = summary.students - summary.graded
    summary.seconds = time.perf_counter() - started
    summary.phases = {k: round(v, 2) for k, v in phases.items()}
    write_atomic(out / "run.json", json.dumps(asdict(summary), indent=2) + "\n")
    return all_rows, summary


def _grade_all(todo, course, wanted, references, sandbox, timeout, jobs, dask_address):
    """Yield (submission, (rows, timings)) as students finish, on local threads or a Dask cluster."""
    if dask_address:
        from .cluster import grade_on_dask

        yield from grade_on_dask(dask_address, todo, course, wanted, references, sandbox, timeout)
        return
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        futures = {pool.submit(grade_submission, sub, course, wanted, references, sandbox, timeout): sub
                   for sub in todo}
        for future in as_completed(futures):
            yield futures[future], future.result()


def _state_file(state: Path, sub: Submission) -> Path:
    return state / (hashlib.sha256(sub.student.encode()).hexdigest()[:24] + ".json")


def _load_state(state: Path, sub: Submission, version: str, wanted: list[str]) -> list[Row] | None:
    try:
        saved = json.loads(_state_file(state, sub).read_text())
    except (OSError, ValueError):
        return None
    if saved.get("fingerprint") != sub.fingerprint() or saved.get("version") != version or saved.get("wanted") != wanted:
        return None
    return [Row(**r) for r in saved["rows"]]


def _save_state(state: Path, sub: Submission, version: str, wanted: list[str], rows: list[Row]) -> None:
    write_atomic(_state_file(state, sub), json.dumps({
        "student": sub.student, "fingerprint": sub.fingerprint(), "version": version, "wanted": wanted,
        "rows": [asdict(r) for r in rows]}))
