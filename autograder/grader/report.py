"""What the instructor gets: grades.csv, an LMS-ready summary.csv, per-student feedback (Markdown + HTML).

Every file is written atomically (temporary file + rename), and its content depends only on the
rows, so grading the same submissions twice gives byte-identical files. Everything a student could
have chosen (ids, names, file names, messages, printed output) goes through ``escape.py`` on its way
into a file: no formula, escape sequence, Markdown or HTML of theirs survives. Feedback files are named
``<readable prefix>-<hash of the student id>``; ``feedback/index.csv`` says whose is which.
"""
import html
from collections import defaultdict
from pathlib import Path

from ..exercises.exercise import CheckResult
from ..exercises.judging.diagnosis import Diagnosis
from ..exercises.judging.feedback import Section, consequence_line, explained_line, sections
from .escape import file_stem, md_code, md_text, strip_controls
from .outputs import FEEDBACK, GRADES, SUMMARY, csv_text, write_atomic
from .rows import Row


def _number(x: float) -> str:
    return f"{x:g}"


def grades_csv(rows: list[Row]) -> str:
    return csv_text(list(Row.CSV_FIELDS), [[r.student, r.notebook, r.exercise, _number(r.score), _number(r.max_score),
                                        r.feedback, r.name, r.cause] for r in rows])


def summary_csv(rows: list[Row], exercises: list[str]) -> str:
    """One row per student: id, name, a column per exercise, then total, maximum and percent (LMS import)."""
    by_student = defaultdict(dict)
    names, maxima = {}, {}
    for r in rows:
        by_student[r.student][r.exercise] = r.score
        names[r.student] = r.name
        maxima[r.exercise] = r.max_score
    exercises = [e for e in exercises if e in maxima]
    max_total = sum(maxima[e] for e in exercises)
    table = []
    for student in sorted(by_student):
        got = sum(by_student[student].get(e, 0.0) for e in exercises)
        table.append([student, names[student]] + [_number(by_student[student].get(e, 0.0)) for e in exercises]
                     + [_number(got), _number(max_total), f"{100 * got / max_total:.1f}" if max_total else "0.0"])
    header = ["student", "name"] + [f"{e} ({_number(maxima[e])})" for e in exercises] + ["total", "max_total", "percent"]
    return csv_text(header, table)


def _sections(row: Row) -> list[Section]:
    return sections([CheckResult(**c) for c in row.checks], Diagnosis.from_dict(row.diagnosis))


def _blank_notebooks(rows: list[Row]) -> dict[str, list[Row]]:
    """Notebooks of more than one exercise none of which was started: one line for the notebook, not one each."""
    by_notebook = defaultdict(list)
    for r in rows:
        by_notebook[r.notebook].append(r)
    return {n: rs for n, rs in by_notebook.items() if len(rs) > 1 and all(r.cause == "not_started" for r in rs)}


def _blank_line(rows: list[Row]) -> str:
    return (f"Not started: none of its {len(rows)} exercises has been written yet (each function still raises "
            "NotImplementedError).")


def feedback_markdown(student: str, rows: list[Row]) -> str:
    got, best = sum(r.score for r in rows), sum(r.max_score for r in rows)
    name = rows[0].name if rows and rows[0].name and rows[0].name != student else ""
    lines = [f"# Feedback for {md_text(student)}" + (f" ({md_text(name)})" if name else ""), "",
             f"**Total: {_number(got)} / {_number(best)} points**", ""]
    blank, done = _blank_notebooks(rows), set()
    for r in rows:
        if r.notebook in blank:
            if r.notebook not in done:
                done.add(r.notebook)
                lines += [f"## {md_text(r.notebook)}: 0 / {_number(sum(x.max_score for x in blank[r.notebook]))}", "",
                          md_text(_blank_line(blank[r.notebook])), ""]
            continue
        lines += [f"## {md_text(r.exercise)} ({md_text(r.notebook)}): {_number(r.score)} / {_number(r.max_score)}", ""]
        if not r.checks:
            lines += [f"Not graded: {md_text(r.feedback)}", ""]
        for section in _sections(r) if r.checks else []:
            lines.append(("**" + md_text(section.heading) + "**") if section.kind in ("cause", "one_line", "where")
                         else md_text(section.heading))
            lines.append("")
            lines += [f"- *{md_text(label)}:* {md_text(text)}" for label, text in section.details]
            if section.kind == "cause":
                lines.append(f"- *{md_text(consequence_line(section))}*")
            elif section.kind == "where" and section.checks:
                lines.append(f"- *{md_text(explained_line(section))}*")
            for c in section.checks:
                mark = "✅" if c.passed else "❌"
                lines.append(f"- {mark} {md_text(c.title)} ({_number(c.score)}/{_number(c.points)})"
                             + (f"  \n  {md_text(c.feedback)}" if c.feedback and section.advice else ""))
            lines.append("")
        if r.output.strip():
            lines += ["", "Your code printed (first lines):", "", *md_code(r.output.strip()[:1500])]
        lines.append("")
    return "\n".join(lines)


def feedback_html(student: str, rows: list[Row]) -> str:
    got, best = sum(r.score for r in rows), sum(r.max_score for r in rows)

    def e(text) -> str:
        return html.escape(strip_controls(text))

    parts = [f"<!doctype html><meta charset='utf-8'><title>Feedback for {e(student)}</title>",
             "<style>body{font-family:sans-serif;max-width:50em;margin:2em auto}.pass{color:#1a7f37}"
             ".fail{color:#b3261e}pre{background:#f4f4f4;padding:.5em;white-space:pre-wrap}"
             ".cause{border-left:4px solid #b3261e;padding-left:.8em}</style>",
             f"<h1>Feedback for {e(student)}</h1><p><b>Total: {_number(got)} / {_number(best)} points</b></p>"]
    blank, done = _blank_notebooks(rows), set()
    for r in rows:
        if r.notebook in blank:
            if r.notebook not in done:
                done.add(r.notebook)
                parts.append(f"<h2>{e(r.notebook)}: 0 / {_number(sum(x.max_score for x in blank[r.notebook]))}</h2>"
                             f"<p class='fail'>{e(_blank_line(blank[r.notebook]))}</p>")
            continue
        parts.append(f"<h2><code>{e(r.exercise)}</code> ({e(r.notebook)}): {_number(r.score)} / {_number(r.max_score)}</h2>")
        if not r.checks:
            parts.append(f"<p class='fail'>Not graded: {e(r.feedback)}</p>")
        for section in _sections(r) if r.checks else []:
            if section.kind == "one_line":
                parts.append(f"<p class='fail'><b>{e(section.heading)}</b></p>")
                continue
            parts.append(f"<div class='{e(section.kind)}'><p><b>{e(section.heading)}</b></p>")
            if section.details or section.kind == "cause":
                follows = (consequence_line(section) if section.kind == "cause"
                           else explained_line(section) if section.kind == "where" and section.checks else "")
                parts.append("<dl>" + "".join(f"<dt>{e(label)}</dt><dd>{e(text)}</dd>" for label, text in section.details)
                             + "</dl>" + (f"<p><i>{e(follows)}</i></p>" if follows else ""))
            parts.append("<ul>")
            for c in section.checks:
                parts.append(f"<li class='{'pass' if c.passed else 'fail'}'>{'PASS' if c.passed else 'FAIL'} "
                             f"{e(c.title)} ({_number(c.score)}/{_number(c.points)})"
                             + (f"<br>{e(c.feedback)}" if c.feedback and section.advice else "") + "</li>")
            parts.append("</ul></div>")
        if r.output.strip():
            parts.append(f"<p>Your code printed (first lines):</p><pre>{e(r.output.strip()[:1500])}</pre>")
    return "\n".join(parts) + "\n"


def feedback_name(student: str) -> str:
    return file_stem(student)


def write_reports(out: Path, rows: list[Row], exercises: list[str]) -> list[str]:
    """Write every report; returns problems (a file that could not be written), never stops half-way."""
    write_atomic(out / GRADES, grades_csv(rows))
    write_atomic(out / SUMMARY, summary_csv(rows, exercises))
    by_student = defaultdict(list)
    for r in rows:
        by_student[r.student].append(r)
    problems, index = [], []
    for student in sorted(by_student):
        stem = feedback_name(student)
        index.append([student, by_student[student][0].name, f"{stem}.md", f"{stem}.html"])
        try:
            write_atomic(out / FEEDBACK / f"{stem}.md", feedback_markdown(student, by_student[student]))
            write_atomic(out / FEEDBACK / f"{stem}.html", feedback_html(student, by_student[student]))
        except OSError as exc:
            problems.append(f"feedback for {student!r}: {exc}")
    write_atomic(out / FEEDBACK / "index.csv", csv_text(["student", "name", "markdown", "html"], index))
    return problems
