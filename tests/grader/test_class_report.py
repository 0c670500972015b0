"""The class report (autograder/grader/class_report.py) and similar submissions (autograder/grader/similarity.py).

Fast: the report built from rows (mistakes with counts and students, pass rates, who needs attention), escaped
everywhere; winnowing finds renamed copies and not independent solutions. Slow: a class of 32 mixed submissions
graded with the real CLI, the report rebuilt by `python -m autograder report OUT`, rendered in Chromium with a
screenshot kept under test-artifacts/class-report/.
"""
import csv
import json
import subprocess
import sys
import time

import pytest
from browser_helpers import CHROMIUM_ARGS, chromium_executable, playwright_or_skip
from class_helpers import build_mixed_class, renamed
from conftest import REPO, variant_modules

from autograder.authoring.course import load_course
from autograder.grader.class_report import build, released_cells, write_class_report
from autograder.grader.rows import Row
from autograder.grader.similarity import fingerprints, similar_pairs, tokens

ARTIFACTS = REPO / "test-artifacts" / "class-report"
EVIL = '<script>alert("x")</script>'


def _row(student, exercise="train_with_accumulation", score=11.0, cause="", graded=True, feedback="", review=(),
         checks=None):
    checks = checks if checks is not None else [
        {"title": "Steps once every accumulation_steps batches", "points": 2.0, "score": 2.0 if score else 0.0,
         "feedback": ""},
        {"title": "Puts the model in training mode", "points": 1.0, "score": 1.0 if score == 11 else 0.0,
         "feedback": ""}]
    diagnosis = {"kind": "cause", "causes": [{"id": cause, "did": f"did {cause}.", "why": "w.", "fix": "f.",
                                              "seen": "s.", "explains": []}], "unexplained": []} if cause else {}
    return Row(student, "01_gradient_accumulation.ipynb", exercise, score, 11.0, feedback, checks if graded else [],
               graded=graded, name=student.upper(), review=list(review), cause=cause, diagnosis=diagnosis)


def test_the_report_counts_mistakes_pass_rates_and_who_needs_attention():
    rows = [_row("ann"), _row("bob", score=3, cause="loss_not_divided"), _row("cy", score=3, cause="loss_not_divided"),
            _row("dee", score=0, cause="not_started"),
            _row("eve", score=0, graded=False, feedback="Your code did not finish within 20 s (an endless loop)."),
            _row("fay", score=8)]
    report = build(rows, ["train_with_accumulation"], {"seconds": 12.0}, [])
    (ex,) = report.exercises
    assert [(m["id"], m["count"], m["students"]) for m in ex.mistakes] == [
        ("loss_not_divided", 2, ["bob", "cy"]), ("(no known mistake)", 1, ["fay"]), ("not_started", 1, ["dee"])]
    assert ex.scores == [11.0, 3, 3, 0, 8] and ex.ungraded == 1
    assert [(c["passed"], c["total"]) for c in ex.checks] == [(4, 5), (1, 5)]
    attention = {a["student"]: a for a in report.attention}
    assert set(attention) == {"dee", "eve"} and attention["eve"]["timed_out"] and "timed out" in attention["eve"]["why"][0]
    assert attention["dee"]["why"] == ["nothing started"]


def test_any_exercise_at_zero_or_raising_needs_attention_and_timings_read_in_words():
    """Not only a student with nothing started: one exercise at 0 of two, or one that raised, is flagged; a
    localised cause ("where: ...") counts as no known mistake; the timing table has words, not run.json's keys."""
    from autograder.grader.class_report import timing_rows

    raised = _row("gus", exercise="other", score=5)
    raised.diagnosis = {"kind": "unknown", "located": ["Your function raised ValueError: x when called."]}
    rows = [_row("fay", score=0, checks=[]), _row("fay", exercise="other", score=4), _row("gus"), raised,
            _row("hal", score=3, cause="where: dk ×√d")]
    rows[0].checks = [{"title": "t", "points": 1.0, "score": 0.0, "feedback": "f"}]
    report = build(rows, ["train_with_accumulation", "other"], {"seconds": 12.0}, [])
    attention = {a["student"]: a["why"] for a in report.attention}
    assert attention["fay"] == ["train_with_accumulation: 0 points"]
    assert attention["gus"] == ["other: it raised an error"] and "hal" not in attention
    mistakes = {m["id"]: m["students"] for m in report.exercises[0].mistakes}
    assert mistakes == {"(no known mistake)": ["fay", "hal"]}
    labels = dict(timing_rows({"phases": {"reference_s": 1.234, "run_s": 20.41, "worker_peak_mib": 300.0}}))
    assert all("_" not in label for label in labels) and labels["largest memory of one worker"] == "300.0 MiB"


def test_every_student_controlled_string_is_escaped(tmp_path):
    rows = [_row(EVIL, score=0, cause="not_started", review=[f"line 1: replaces {EVIL}"]),
            _row("=HYPERLINK(\"http://x\")", score=0, graded=False, feedback=EVIL + "\x1b[2J")]
    rows[1].name = "@SUM(A1)\u202e"
    pairs = [{"exercise": "train_with_accumulation", "a": EVIL, "b": "=cmd|' /C calc'!A0", "similarity": 0.9,
              "shared": 20}]
    assert write_class_report(tmp_path, rows, ["train_with_accumulation"], {"seconds": 1.0}, pairs) == []
    page = (tmp_path / "report.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page and "\x1b" not in page and "\u202e" not in page
    assert "Content-Security-Policy" in page
    for name in ("attention.csv", "review.csv", "similar.csv", "mistakes.csv"):
        for row in csv.reader((tmp_path / "report" / name).open(newline="")):
            assert not any(cell.startswith(("=", "@", "+", "-")) for cell in row), (name, row)


def test_a_class_without_mistakes_or_rows(tmp_path):
    assert write_class_report(tmp_path, [_row("ann")], ["train_with_accumulation"], {}, []) == []
    assert "Every student earned points" in (tmp_path / "report.html").read_text()
    assert write_class_report(tmp_path / "empty", [], ["train_with_accumulation"], {}, []) == []


def test_a_report_from_an_out_folder(tmp_path):
    """`python -m autograder report OUT` rebuilds the page from what a grading run left (results.json)."""
    rows = [_row("ann"), _row("bob", score=3, cause="loss_not_divided")]
    assert write_class_report(tmp_path, rows, ["train_with_accumulation"], {"seconds": 1.0}, []) == []
    (tmp_path / "report.html").unlink()
    run = subprocess.run([sys.executable, "-m", "autograder", "report", str(tmp_path)], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "loss_not_divided" in (tmp_path / "report.html").read_text()
    missing = subprocess.run([sys.executable, "-m", "autograder", "report", str(tmp_path / "nowhere")],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    assert missing.returncode == 2 and "results.json" in missing.stderr


# ---- similar submissions -------------------------------------------------------------------------

def _scaffolds():
    course = load_course()
    return released_cells(course, ["01_gradient_accumulation.ipynb", "02_mixed_precision.ipynb"])


def test_renamed_copies_are_found_and_independent_solutions_are_not():
    correct = variant_modules()["train_with_accumulation"].CORRECT
    original = correct["model_zero_grad_and_counter"]
    cells = {"train_with_accumulation": {
        "ann": original, "bob": renamed(original),                        # a copy, every local name renamed
        "cy": correct["seed_style"], "dee": correct["zero_at_window_start"],  # two independent correct solutions
        "eve": correct["scale_gradients_not_loss"]}}
    pairs = similar_pairs(cells, _scaffolds())
    assert [(p.a, p.b) for p in pairs] == [("ann", "bob")], pairs
    assert pairs[0].similarity == 1.0


def test_renaming_comments_and_strings_change_no_token():
    a = "def f(x, y):\n    # add them\n    total = x + y  # sum\n    return total.item()\n"
    b = "def g(a, b):\n    s = a + b\n\n    return s.item()\n"
    assert tokens(a) == tokens(b) and "item" in tokens(a)


def test_the_scaffold_and_blank_cells_are_not_evidence():
    scaffold = _scaffolds()["train_with_accumulation"]
    cells = {"train_with_accumulation": {"ann": scaffold, "bob": scaffold, "cy": scaffold + "\n"}}
    assert similar_pairs(cells, _scaffolds()) == []
    assert fingerprints("") == set() and fingerprints("def (") == fingerprints("def (")


# ---- a graded class in Chromium ------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.browser
def test_a_graded_class_of_32_gets_a_report_readable_in_chromium(tmp_path):
    chromium = chromium_executable()
    start_playwright = playwright_or_skip()
    expected = build_mixed_class(tmp_path / "submissions")
    out = tmp_path / "out"
    grade = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp_path / "submissions"), "--out", str(out),
                            "--quiet", "--jobs", "2", "--timeout", "20"], capture_output=True, text=True, cwd=REPO,
                           timeout=1200)
    assert grade.returncode == 0, grade.stdout + grade.stderr
    with open(out / "grades.csv", newline="") as f:
        grades = list(csv.DictReader(f))
    assert len({g["student"] for g in grades}) == expected["students"] >= 30
    assert {g["cause"] for g in grades} >= {"loss_not_divided", "not_started", "clips_before_unscaling"}

    started = time.perf_counter()
    report = subprocess.run([sys.executable, "-m", "autograder", "report", str(out), "--submissions",
                             str(tmp_path / "submissions")], capture_output=True, text=True, cwd=REPO, timeout=300)
    seconds = time.perf_counter() - started
    assert report.returncode == 0, report.stdout + report.stderr
    page = (out / "report.html").read_text()
    assert "<img src=x" not in page and "&lt;img src=x" in page
    similar = [(r["student_a"], r["student_b"]) for r in csv.DictReader((out / "similar.csv").open(newline=""))]
    assert tuple(sorted(expected["copies"])) in similar
    attention = (out / "report" / "attention.csv").read_text()
    for who in (expected["timed_out"], expected["damaged"], expected["blank"]):
        assert who in attention
    assert expected["reaches_in"] in (out / "report" / "review.csv").read_text()

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with start_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page_ = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = []
        page_.on("pageerror", lambda exc: errors.append(str(exc)))
        page_.on("dialog", lambda dialog: errors.append(f"dialog: {dialog.message}") or dialog.dismiss())
        page_.goto((out / "report.html").as_uri())
        page_.wait_for_selector("text=Needs attention")
        assert page_.locator("img[alt='Students per mistake']").evaluate("img => img.naturalWidth") > 100
        assert page_.locator("img[alt='Score distribution per exercise']").evaluate("img => img.naturalWidth") > 100
        assert page_.get_by_text(expected["hostile"], exact=False).count() >= 1  # shown as text, not run as HTML
        page_.screenshot(path=str(ARTIFACTS / "report-top.png"))
        page_.screenshot(path=str(ARTIFACTS / "report-full.png"), full_page=True)
        browser.close()
    assert errors == []
    (ARTIFACTS / "timing.json").write_text(json.dumps({"students": expected["students"], "report_s": round(seconds, 2),
                                                       "grading_s": json.loads((out / "run.json").read_text())["seconds"]}))
