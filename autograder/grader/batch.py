"""Grade a whole class: discover, observe the references, grade students in parallel, write reports.

Nothing lost, repeatable: each finished student is saved at once under ``OUT/.state`` (atomically), so an
interrupted run resumes without regrading them; the reports are rebuilt from those saves, sorted, so
the same submissions give the same files. A save is reused only when the grader's code, the references,
the isolation, every limit and the time-out are the same as now; anything else is graded again.

Which notebooks are graded: ``--notebook``, or else those that more than half of the students submitted.
A notebook only a few students handed in (another lesson's file, an empty ``{}``) is left out for
everyone and named in the summary, so no student's upload adds 0-rows or lowers percentages of others.
"""
import hashlib
import json
import os
import resource
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from ..authoring.course import Course, load_course
from ..exercises import get_exercise
from ..selfcheck.fingerprint import code_fingerprint, grader_code
from .grading import SubmittedNotebook, grade_submission, read_notebooks
from .isolation import worker_kinds
from .outputs import load_state, save_run, save_state
from .references import reference_observations
from .report import write_reports
from .rows import Row
from .runner import close_idle_workers, keep_idle_workers, prestart
from .sandbox.launch import Sandbox
from .submissions import Submission, discover, submitted_notebooks


@dataclass
class BatchSummary:
    students: int = 0
    graded: int = 0            # students whose every exercise ran (whatever the score)
    with_problems: int = 0     # students with at least one exercise that could not run
    resumed: int = 0           # students taken from an earlier, interrupted run
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)
    isolation: str = ""
    devices: str = ""          # what every worker, the reference's too, could use: the CPU, and a GPU or not
    scenarios: str = ""        # held-out (the default) or public
    gradebook: str = ""        # where scores were recorded for nbgrader's tools, if asked
    left_out: dict = field(default_factory=dict)   # notebook -> how many students submitted it (not graded)
    regraded: int = 0          # saved results made under other isolation/limits, graded again
    problems: list = field(default_factory=list)   # outputs that could not be written
    serialised: str = ""       # why rank exercises were graded one student at a time, if they were

    def line(self) -> str:
        return (f"{self.students} students: {self.graded} fully graded, {self.with_problems} with ungradable "
                f"exercises (reasons in grades.csv), {self.resumed} resumed; {self.seconds:.1f} s; {self.scenarios} "
                f"scenarios; isolation: {self.isolation}; devices: {self.devices}"
                + (f"; {self.serialised}" if self.serialised else ""))

    def notes(self) -> list[str]:
        notes = [f"{name} was submitted by only {count} of {self.students} students: not graded for anyone "
                 f"(pass --notebook {name} to grade it)" for name, count in sorted(self.left_out.items())]
        if self.regraded:
            notes.append(f"{self.regraded} saved results were made with other isolation or limits: graded again")
        return notes + [f"could not write {p}" for p in self.problems]


def _grader_version(references: dict, sandbox: Sandbox, timeout: float | None) -> str:
    """Changes when the grader's code, the reference results, the isolation or a limit changes: then
    earlier saves are stale (a result graded without isolation is never kept once isolation exists)."""
    digest = hashlib.sha256(json.dumps(references, sort_keys=True).encode())
    digest.update(f"{sandbox.fingerprint()}|timeout={timeout}".encode())
    digest.update(code_fingerprint(grader_code()).encode())
    return digest.hexdigest()[:16]


def _wanted_notebooks(submissions: list[Submission], course: Course) -> tuple[list[str], dict[str, int]]:
    """The notebooks more than half of the students submitted (by name or content), and the others with
    their counts. With no majority (a class split across lessons) the most submitted ones are graded."""
    counts = {name: 0 for name in course.notebooks}
    for sub in submissions:
        for name in submitted_notebooks(sub, course):
            counts[name] += 1
    wanted = [n for n, c in counts.items() if c and 2 * c > len(submissions)]
    if not wanted and any(counts.values()):
        wanted = [n for n, c in counts.items() if c == max(counts.values())]
    return wanted or list(course.notebooks), {n: c for n, c in counts.items() if c and n not in wanted}


def grade_class(submissions_path: Path, out: Path, sandbox: Sandbox, *, jobs: int | None = None,
                timeout: float | None = None, dask_address: str | None = None, progress: bool = True,
                notebooks: list[str] | None = None, gradebook: bool = False,
                salt: int | None = None) -> tuple[list[Row], BatchSummary]:
    """Grade every submission under ``submissions_path`` into ``out``. ``salt``: None grades each exercise on
    its held-out scenarios (never the public ones whose reference results ship to students); 0 grades on the
    public scenarios, exactly what the students' self-checks ran."""
    started = time.perf_counter()
    course = load_course()
    submissions = discover(Path(submissions_path), course)
    wanted, left_out = (notebooks, {}) if notebooks else _wanted_notebooks(submissions, course)
    exercises = [e for n in wanted for e in course.notebooks[n].exercises]
    threads = jobs or os.cpu_count() or 1
    if not dask_address and submissions:
        # the first students' workers start while the references are observed (their start-up is seconds of
        # CPU, the references leave a core idle at times); each kind kept for the next student (runner.IDLE_WORKERS)
        kinds = worker_kinds(exercises, sandbox)
        keep_idle_workers(len(kinds) * threads)
        for made in kinds:
            prestart(made, min(threads, len(submissions)))
    try:
        references = reference_observations(course, exercises, sandbox, salt, jobs=threads)
    except BaseException:
        close_idle_workers()
        raise
    reference_s = time.perf_counter() - started
    version = _grader_version(references, sandbox, timeout)
    serialised = ("rank exercises graded one student at a time, with no other worker alive (every worker runs as the "
                  "grader's uid; grade as root, or give the grader's user subordinate uids in /etc/subuid and "
                  "/etc/subgid, for one uid per worker)") if sandbox.one_identity and any(
        get_exercise(e).ranks for e in exercises) else ""
    summary = BatchSummary(students=len(submissions), isolation=sandbox.describe(), left_out=left_out,
                           serialised=serialised,
                           devices=sandbox.devices.describe(),
                           scenarios="held-out" if salt is None else "public" if salt == 0 else f"salt {salt}")
    reading = time.perf_counter()
    notebooks = {sub.student: _read_notebooks(sub, course, wanted) for sub in submissions}  # once: grading, similarity
    read_s = time.perf_counter() - reading
    rows_by_student: dict[str, list[Row]] = {}
    todo = []
    for sub in submissions:
        saved = _load_state(out, sub, version, wanted)
        if isinstance(saved, list):
            rows_by_student[sub.student] = saved
            summary.resumed += 1
        else:
            summary.regraded += saved == "stale"
            todo.append(sub)

    phases = {"reference_s": reference_s, "parse_s": read_s, "run_s": 0.0, "verdict_s": 0.0, "worker_peak_mib": 0.0}
    bar = tqdm(total=len(todo), desc="grading", unit="student", disable=not progress)
    for sub, (rows, timings) in _grade_all(todo, course, wanted, references, sandbox, timeout, threads, dask_address,
                                           notebooks):
        save_state(out, sub.student, {"fingerprint": sub.fingerprint(), "version": version, "wanted": wanted}, rows)
        rows_by_student[sub.student] = rows
        for key, value in timings.items():
            phases[key] = max(phases[key], value) if key == "worker_peak_mib" else phases[key] + value
        bar.update()
    bar.close()

    all_rows = [r for student in sorted(rows_by_student) for r in rows_by_student[student]]
    summary.problems += write_reports(out, all_rows, exercises)
    if gradebook:
        from .gradebook import record_in_gradebook

        summary.gradebook, problems = record_in_gradebook(all_rows, submissions, course)
        summary.problems += problems
    summary.graded = sum(all(r.graded for r in rows) for rows in rows_by_student.values())
    summary.with_problems = summary.students - summary.graded
    summary.seconds = time.perf_counter() - started
    phases["grader_peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the shared process
    summary.phases = {k: round(v, 2) for k, v in phases.items()}
    save_run(out, asdict(summary))
    from .class_report import write_for_run  # the class report (matplotlib, jinja2) only once the grades are safe

    summary.problems += write_for_run(out, all_rows, exercises, asdict(summary), notebooks, course, wanted)
    return all_rows, summary


def _read_notebooks(sub: Submission, course: Course, wanted: list[str]) -> dict[str, SubmittedNotebook] | None:
    """What the submission's notebooks hold, or None when reading them fails in the grader's own code: grading the
    student then meets the failure again and turns it into that student's rows (grading.grade_submission)."""
    try:
        return read_notebooks(sub, course, wanted)
    except Exception:  # a grader bug this submission triggers must cost only this student's grade
        return None


def _grade_all(todo, course, wanted, references, sandbox, timeout, threads, dask_address, notebooks):
    """Yield (submission, (rows, timings)) as students finish, on local threads or a Dask cluster."""
    if dask_address:
        from .cluster import grade_on_dask

        yield from grade_on_dask(dask_address, todo, course, wanted, references, sandbox, timeout, notebooks)
        return
    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            futures = {pool.submit(grade_submission, sub, course, wanted, references, sandbox, timeout,
                                   notebooks[sub.student]): sub
                       for sub in todo}
            for future in as_completed(futures):
                yield futures[future], future.result()
    finally:
        close_idle_workers()


def _load_state(out: Path, sub: Submission, version: str, wanted: list[str]) -> list[Row] | str | None:
    """The saved rows, or "stale" (saved under another grader version, isolation or limits), or None."""
    found = load_state(out, sub.student)
    if found is None:
        return None
    saved, rows = found
    if saved.get("fingerprint") != sub.fingerprint() or saved.get("wanted") != wanted:
        return None
    return "stale" if saved.get("version") != version else rows
