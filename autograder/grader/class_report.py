"""The class report: what the class got wrong, readable in a minute (``OUT/report.html`` and ``OUT/report/*.csv``).

Written by every ``python -m autograder grade`` run, and on demand from an OUT folder (``python -m autograder report
OUT``), from ``OUT/results.json`` (every row, saved by the run), ``OUT/run.json`` (the run's summary) and
``OUT/similar.csv`` (similar submissions, ``similarity.py``). It shows, in this order: who needs attention (a total
of 0, an exercise that could not run or timed out), the mistakes diagnosed with their counts and students
(``exercises/judging/diagnosis.py``), the score distribution and per-check pass rates of each exercise, similar pairs of
cells, the cells an instructor may want to read (``audit.py``), and the grading time.

Every student-controlled string (ids, names, reasons, findings quoting their code) is escaped: jinja2 with
autoescape for HTML, ``escape.csv_cell`` for the CSVs, control characters stripped for both. The plots
(matplotlib, imported only here: the grader's process stays free of it until a report is drawn) show only the
course's own words (exercises, check titles, mistake ids) and numbers; they are inlined as PNG data.
"""
import base64
import csv
import io
import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .escape import strip_controls
from .outputs import REPORT_HTML, REPORT_TABLES, SIMILAR, csv_text, load_rows, load_run, save_rows, write_atomic
from .rows import Row
from .similarity import Pair

TEMPLATE = Path(__file__).with_name("class_report.html.j2")
TIMED_OUT = "did not finish within"
LOCATED = "where: "  # grades.csv's cause when no catalogue mistake is named (diagnosis.Diagnosis.cause_id)


@dataclass
class ExerciseSummary:
    name: str
    notebook: str
    max_score: float
    scores: list[float] = field(default_factory=list)      # graded students only
    ungraded: int = 0
    checks: list[dict] = field(default_factory=list)       # title, points, passed, total, rate
    mistakes: list[dict] = field(default_factory=list)     # id, did, count, students

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0

    @property
    def full(self) -> int:
        return sum(s == self.max_score for s in self.scores)

    @property
    def zero(self) -> int:
        return sum(s == 0 for s in self.scores)


@dataclass
class ClassReport:
    students: int
    exercises: list[ExerciseSummary]
    attention: list[dict]        # student, name, total, max, why
    review: list[dict]           # student, name, exercise, finding
    similar: list[dict]          # exercise, a, b, similarity, shared
    run: dict
    totals: list[float]          # percent per student
    drawn_s: float = 0.0


def build(rows: list[Row], exercises: list[str], run: dict, pairs: list[dict]) -> ClassReport:
    by_exercise = {e: [r for r in rows if r.exercise == e] for e in exercises}
    by_student = defaultdict(list)
    for r in rows:
        by_student[r.student].append(r)
    names = {r.student: r.name for r in rows}
    found = []
    for name, ex_rows in by_exercise.items():
        if not ex_rows:
            continue
        ex = ExerciseSummary(name, ex_rows[0].notebook, ex_rows[0].max_score)
        graded = [r for r in ex_rows if r.graded]
        ex.scores = [r.score for r in graded]
        ex.ungraded = len(ex_rows) - len(graded)
        titles = list(dict.fromkeys(c["title"] for r in graded for c in r.checks))
        for title in titles:
            results = [c for r in graded for c in r.checks if c["title"] == title]
            passed = sum(c["score"] == c["points"] for c in results)
            ex.checks.append({"title": title, "points": results[0]["points"], "passed": passed, "total": len(results),
                              "rate": passed / len(results) if results else 0.0})
        causes = defaultdict(list)
        did = {}
        for r in graded:
            for cause in (r.cause.split("+") if r.cause and not r.cause.startswith(LOCATED) else []):
                causes[cause].append(r.student)
            for c in (r.diagnosis or {}).get("causes", []):
                did.setdefault(c["id"], c["did"])
        did.setdefault("not_started", "The function still raises NotImplementedError.")
        unknown = [r.student for r in graded
                   if r.score < r.max_score and (not r.cause or r.cause.startswith(LOCATED))]
        if unknown:
            causes["(no known mistake)"] = unknown
            did["(no known mistake)"] = ("Failed checks that match no mistake of the catalogue (grades.csv's cause "
                                         "says where their results go wrong): read these.")
        ex.mistakes = sorted(({"id": k, "did": did.get(k, ""), "count": len(v), "students": sorted(v)}
                              for k, v in causes.items()), key=lambda m: (-m["count"], m["id"]))
        found.append(ex)
    attention, totals = [], []
    for student in sorted(by_student):
        mine = by_student[student]
        got, best = sum(r.score for r in mine), sum(r.max_score for r in mine)
        totals.append(100 * got / best if best else 0.0)
        why = [f"{r.exercise}: {'timed out' if TIMED_OUT in r.feedback else 'could not run'} ({r.feedback[:160]})"
               for r in mine if not r.graded]
        if got == 0 and not why and all(r.cause == "not_started" for r in mine):
            why.append("nothing started")
        elif got == 0 and not why:
            why.append("0 points in every exercise")
        else:  # any exercise at 0 or that raised, not only a student with nothing started
            why += [f"{r.exercise}: {_zero_or_error(r)}" for r in mine if r.graded and _zero_or_error(r)]
        if why:
            attention.append({"student": student, "name": names[student], "total": got, "max": best,
                              "timed_out": any(TIMED_OUT in r.feedback for r in mine if not r.graded), "why": why})
    review = [{"student": r.student, "name": r.name, "exercise": r.exercise, "finding": f}
              for r in rows for f in r.review]
    return ClassReport(len(by_student), found, attention, review, pairs, run, totals)


def _zero_or_error(row: Row) -> str:
    """Why a graded exercise needs a look: 0 points (not started, or every check failed), or it raised."""
    located = (row.diagnosis or {}).get("located", ())
    raised = any(isinstance(line, str) and line.startswith("Your function raised") for line in located)
    if row.score == 0:
        return "0 points, not started" if row.cause == "not_started" else "0 points" + (", it raised" if raised else "")
    return "it raised an error" if raised else ""


PHASES = {  # run.json's phases in words: (label, unit)
    "reference_s": ("observing the reference solutions", "s"),
    "parse_s": ("reading the submissions, summed over students", "s"),
    "run_s": ("running student code, summed over the workers (they run side by side)", "s"),
    "verdict_s": ("checks and diagnosis, summed over students", "s"),
    "worker_peak_mib": ("largest memory of one worker", "MiB"),
    "grader_peak_mib": ("memory of the grading process", "MiB"),
}


def timing_rows(run: dict) -> list[tuple[str, str]]:
    """The grading time table: readable labels, one unit each; unknown keys keep their name."""
    rows = []
    for key, value in (run.get("phases") or {}).items():
        label, unit = PHASES.get(str(key), (str(key), ""))
        try:
            rows.append((label, f"{float(value):.1f} {unit}".strip()))
        except (TypeError, ValueError):
            continue
    return rows


# ---- plots (matplotlib, only here) ----------------------------------------------------------------

def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def plots(report: ClassReport) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
                         "text.usetex": False, "text.parse_math": False})
    drawn = {}
    exercises = report.exercises
    if exercises:
        cols = min(3, len(exercises))
        rows = -(-len(exercises) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.3 * rows), squeeze=False)
        for ax, ex in zip(axes.flat, exercises):
            bins = [x - 0.5 for x in range(int(ex.max_score) + 2)]
            ax.hist(ex.scores, bins=bins, color="#3a6ea5", edgecolor="white")
            ax.set_title(f"{ex.name} (mean {ex.mean:.1f} / {ex.max_score:g})", fontsize=9)
            ax.set_xlabel("points")
            ax.set_ylabel("students")
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        for ax in list(axes.flat)[len(exercises):]:
            ax.axis("off")
        fig.tight_layout()
        drawn["scores"] = _png(fig)
        plt.close(fig)
        checks = [(f"{ex.name}: {c['title'][:60]}", c["rate"]) for ex in exercises for c in ex.checks]
        if checks:
            fig, ax = plt.subplots(figsize=(8, 0.22 * len(checks) + 0.8))
            labels, rates = zip(*reversed(checks))
            ax.barh(range(len(rates)), [100 * r for r in rates],
                    color=["#b3261e" if r < 0.5 else "#e0a100" if r < 0.8 else "#1a7f37" for r in rates])
            ax.set_yticks(range(len(rates)), labels, fontsize=7)
            ax.set_xlim(0, 100)
            ax.set_xlabel("students passing (%)")
            drawn["checks"] = _png(fig)
            plt.close(fig)
        mistakes = sorted(((m["count"], f"{ex.name}: {m['id']}") for ex in exercises for m in ex.mistakes),
                          reverse=True)[:25]
        if mistakes:
            fig, ax = plt.subplots(figsize=(8, 0.25 * len(mistakes) + 0.8))
            counts, labels = zip(*reversed(mistakes))
            ax.barh(range(len(counts)), counts, color="#b3261e")
            ax.set_yticks(range(len(counts)), labels, fontsize=7)
            ax.set_xlabel("students")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # counts of students: whole numbers
            drawn["mistakes"] = _png(fig)
            plt.close(fig)
    return drawn


# ---- files ---------------------------------------------------------------------------------------

def csvs(report: ClassReport) -> dict[str, str]:
    return {
        "exercises.csv": csv_text(["exercise", "notebook", "max_score", "graded", "ungraded", "mean", "full_marks", "zero"],
                              [[e.name, e.notebook, f"{e.max_score:g}", len(e.scores), e.ungraded, f"{e.mean:.2f}",
                                e.full, e.zero] for e in report.exercises]),
        "checks.csv": csv_text(["exercise", "check", "points", "passed", "graded", "pass_rate"],
                           [[e.name, c["title"], f"{c['points']:g}", c["passed"], c["total"], f"{c['rate']:.3f}"]
                            for e in report.exercises for c in e.checks]),
        "mistakes.csv": csv_text(["exercise", "cause", "students_count", "students", "what"],
                             [[e.name, m["id"], m["count"], " ".join(m["students"]), m["did"]]
                              for e in report.exercises for m in e.mistakes]),
        "attention.csv": csv_text(["student", "name", "total", "max_total", "why"],
                              [[a["student"], a["name"], f"{a['total']:g}", f"{a['max']:g}", " | ".join(a["why"])]
                               for a in report.attention]),
        "review.csv": csv_text(["student", "name", "exercise", "finding"],
                           [[r["student"], r["name"], r["exercise"], r["finding"]] for r in report.review]),
        "similar.csv": similar_csv(report.similar),
    }


def similar_csv(pairs: list[dict]) -> str:
    return csv_text(["exercise", "student_a", "student_b", "similarity", "shared_fingerprints"],
                [[p["exercise"], p["a"], p["b"], f"{p['similarity']:.3f}", p["shared"]] for p in pairs])


def read_similar(out: Path) -> list[dict]:
    try:
        with open(out / SIMILAR, newline="", encoding="utf-8") as f:
            return [{"exercise": r["exercise"], "a": r["student_a"], "b": r["student_b"],
                     "similarity": float(r["similarity"]), "shared": int(r["shared_fingerprints"])}
                    for r in csv.DictReader(f)]
    except (OSError, KeyError, ValueError):
        return []


def render(report: ClassReport, drawn: dict[str, str]) -> str:
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["clean"] = lambda text: strip_controls(str(text))
    return env.from_string(TEMPLATE.read_text()).render(r=report, plots=drawn, timings=timing_rows(report.run))


def write_class_report(out: Path, rows: list[Row], exercises: list[str], run: dict,
                       pairs: list[Pair] | list[dict] | None = None) -> list[str]:
    """OUT/report.html and OUT/report/*.csv (and OUT/results.json, OUT/similar.csv when given): problems, if any."""
    started = time.perf_counter()
    try:
        save_rows(out, rows, exercises)
        if pairs is not None:
            pairs = [asdict(p) if isinstance(p, Pair) else p for p in pairs]
            write_atomic(out / SIMILAR, similar_csv(pairs))
        report = build(rows, exercises, run, pairs if pairs is not None else read_similar(out))
        for name, text in csvs(report).items():
            write_atomic(out / REPORT_TABLES / name, text)
        drawn = plots(report)
        report.drawn_s = time.perf_counter() - started
        write_atomic(out / REPORT_HTML, render(report, drawn))
    except Exception as exc:  # the grades are written already: a report that fails must not lose them
        return [f"the class report ({type(exc).__name__}: {exc})"]
    return []


def write_for_run(out: Path, rows: list[Row], exercises: list[str], run: dict, notebooks: dict, course,
                  wanted: list[str]) -> list[str]:
    """The end of a grading run: similar submissions found in the class (from the cells the run read,
    ``notebooks``: student → ``grading.read_notebooks``), then the report."""
    try:
        pairs = similar_in_class(notebooks, course, wanted)
    except Exception as exc:  # a report problem never costs the grades
        return [f"similar submissions ({type(exc).__name__}: {exc})"] + write_class_report(out, rows, exercises, run, [])
    return write_class_report(out, rows, exercises, run, pairs)


def report_from_out(out: Path, submissions: Path | None = None) -> list[str]:
    """``python -m autograder report OUT``: the class report again from a graded OUT folder (similar submissions
    recomputed when the submissions are given, else read from OUT/similar.csv)."""
    rows, exercises = load_rows(out)
    run = load_run(out)
    pairs = None
    if submissions is not None:
        from ..authoring.course import load_course
        from .grading import read_notebooks
        from .submissions import discover

        course = load_course()
        wanted = sorted({r.notebook for r in rows})
        notebooks = {sub.student: read_notebooks(sub, course, wanted) for sub in discover(submissions, course)}
        pairs = similar_in_class(notebooks, course, wanted)
    return write_class_report(out, rows, exercises, run, pairs)


def similar_in_class(notebooks: dict, course, wanted: list[str]) -> list[Pair]:
    """Similar pairs of exercise cells across the class (``similarity.py``), the released scaffold subtracted.
    ``notebooks``: student → what ``grading.read_notebooks`` found (None where reading failed)."""
    from .similarity import similar_pairs

    cells: dict[str, dict[str, str]] = defaultdict(dict)
    for student, found in notebooks.items():
        for notebook in (found or {}).values():
            for exercise, code in notebook.cells.items():
                if isinstance(code, str):
                    cells[exercise][student] = code
    return similar_pairs(cells, released_cells(course, wanted))


def released_cells(course, wanted: list[str]) -> dict[str, str]:
    """Each exercise's cell as released to students (notebooks/), the scaffold that similarity subtracts."""
    from ..authoring.course import cell_source

    found = {}
    for name in wanted:
        paths = [p for p in (course.root / "notebooks").rglob(name) if ".ipynb_checkpoints" not in p.parts]
        if not paths:
            continue
        for cell in json.loads(paths[0].read_text()).get("cells", []):
            grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if grade_id in course.notebooks[name].exercises and cell.get("cell_type") == "code":
                found[grade_id] = cell_source(cell)
    return found
