"""What the instructor gets: grades.csv, an LMS-ready summary.csv, per-student feedback (Markdown + HTML).

Every file is written atomically (temporary file + rename), and its content depends only on the
rows, so grading the same submissions twice gives byte-identical files.
"""
import csv
import html
import io
import os
import tempfile
from collections import defaultdict
from pathlib import Path

from .grading import Row


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _csv(header: list[str], rows: list[list]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def _number(x: float) -> str:
    return f"{x:g}"


def grades_csv(rows: list[Row]) -> str:
    return _csv(list(Row.CSV_FIELDS), [[r.student, r.notebook, r.exercise, _number(r.score), _number(r.max_score),
                                        r.feedback] for r in rows])


def summary_csv(rows: list[Row], exercises: list[str]) -> str:
    """One row per student: a column per exercise, then total, maximum and percent (LMS gradebook import)."""
    by_student = defaultdict(dict)
    maxima = {}
    for r in rows:
        by_student[r.student][r.exercise] = r.score
        maxima[r.exercise] = r.max_score
    exercises = [e for e in exercises if e in maxima]
    max_total = sum(maxima[e] for e in exercises)
    table = []
    for student in sorted(by_student):
        got = sum(by_student[student].get(e, 0.0) for e in exercises)
        table.append([student] + [_number(by_student[student].get(e, 0.0)) for e in exercises]
                     + [_number(got), _number(max_total), f"{100 * got / max_total:.1f}" if max_total else "0.0"])
    header = ["student"] + [f"{e} ({_number(maxima[e])})" for e in exercises] + ["total", "max_total", "percent"]
    return _csv(header, table)


def feedback_markdown(student: str, rows: list[Row]) -> str:
    got, best = sum(r.score for r in rows), sum(r.max_score for r in rows)
    lines = [f"# Feedback for {student}", "", f"**Total: {_number(got)} / {_number(best)} points**", ""]
    for r in rows:
        lines += [f"## `{r.exercise}` ({r.notebook}): {_number(r.score)} / {_number(r.max_score)}", ""]
        if not r.checks:
            lines += [f"Not graded: {r.feedback}", ""]
        for c in r.checks:
            mark = "✅" if c["score"] == c["points"] else "❌"
            lines.append(f"- {mark} {c['title']} ({_number(c['score'])}/{_number(c['points'])})"
                         + (f"  \n  {c['feedback']}" if c["feedback"] else ""))
        if r.output.strip():
            lines += ["", "Your code printed (first lines):", "", "```", r.output.strip()[:1500], "```"]
        lines.append("")
    return "\n".join(lines)


def feedback_html(student: str, rows: list[Row]) -> str:
    got, best = sum(r.score for r in rows), sum(r.max_score for r in rows)
    e = html.escape
    parts = [f"<!doctype html><meta charset='utf-8'><title>Feedback for {e(student)}</title>",
             "<style>body{font-family:sans-serif;max-width:50em;margin:2em auto}.pass{color:#1a7f37}"
             ".fail{color:#b3261e}pre{background:#f4f4f4;padding:.5em;white-space:pre-wrap}</style>",
             f"<h1>Feedback for {e(student)}</h1><p><b>Total: {_number(got)} / {_number(best)} points</b></p>"]
    for r in rows:
        parts.append(f"<h2><code>{e(r.exercise)}</code> ({e(r.notebook)}): {_number(r.score)} / {_number(r.max_score)}</h2>")
        if not r.checks:
            parts.append(f"<p class='fail'>Not graded: {e(r.feedback)}</p>")
        parts.append("<ul>")
        for c in r.checks:
            ok = c["score"] == c["points"]
            parts.append(f"<li class='{'pass' if ok else 'fail'}'>{'PASS' if ok else 'FAIL'} {e(c['title'])} "
                         f"({_number(c['score'])}/{_number(c['points'])})"
                         + (f"<br>{e(c['feedback'])}" if c["feedback"] else "") + "</li>")
        parts.append("</ul>")
        if r.output.strip():
            parts.append(f"<p>Your code printed (first lines):</p><pre>{e(r.output.strip()[:1500])}</pre>")
    return "\n".join(parts) + "\n"


def write_reports(out: Path, rows: list[Row], exercises: list[str]) -> None:
    write_atomic(out / "grades.csv", grades_csv(rows))
    write_atomic(out / "summary.csv", summary_csv(rows, exercises))
    by_student = defaultdict(list)
    for r in rows:
        by_student[r.student].append(r)
    for student, student_rows in by_student.items():
        safe = "".join(ch if ch.isalnum() or ch in "-_.@" else "_" for ch in student) or "student"
        write_atomic(out / "feedback" / f"{safe}.md", feedback_markdown(student, student_rows))
        write_atomic(out / "feedback" / f"{safe}.html", feedback_html(student, student_rows))
