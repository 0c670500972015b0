"""The cause-first feedback reaches every place a student or instructor reads: grades.csv's `cause` column, the
feedback .md/.html files and the autograded notebook's test cell (formgrader). A notebook left blank is one line."""
import csv
import io
from dataclasses import asdict

from conftest import observed, variant_modules

from autograder.exercises.judging.verdict import feedback_sentence, total
from autograder.grader.gradebook import _report_cell
from autograder.grader.report import feedback_html, feedback_markdown, grades_csv
from autograder.grader.rows import Row

EX, NB = "train_with_accumulation", "01_gradient_accumulation.ipynb"
WRONG_ADVICE = ("call model.train() first", "optimizer.zero_grad() before the first batch")


def _row(student="kate", variant="no_division_by_k") -> Row:
    results, diagnosis, _ = observed(EX, variant_modules()[EX].WRONG[variant][0])
    return Row(student, NB, EX, float(total(results)), 11.0, feedback_sentence(results, diagnosis),
               [asdict(r) for r in results], name=student, cause=diagnosis.cause_id, diagnosis=diagnosis.to_dict())


def _blank(student: str, exercise: str, notebook="03_data_parallel.ipynb") -> Row:
    check = {"title": "A check", "points": 1.0, "score": 0.0,
             "feedback": "Your function still raises NotImplementedError: replace that line with your code."}
    return Row(student, notebook, exercise, 0.0, 1.0, check["feedback"], [check, {**check, "title": "Another"}],
               name=student, cause="not_started", diagnosis={"kind": "not_started", "causes": [], "unexplained": []})


def test_grades_csv_has_the_cause_column():
    table = list(csv.DictReader(io.StringIO(grades_csv([_row()]))))
    assert table[0]["cause"] == "loss_not_divided"
    assert table[0]["feedback"].startswith("Cause loss_not_divided: You call backward()")


def test_the_feedback_files_lead_with_the_cause_and_withhold_wrong_advice():
    row = _row()
    markdown, page = feedback_markdown("kate", [row]), feedback_html("kate", [row])
    for text in (markdown, page):
        assert "Most likely cause" in text and "loss_not_divided" in text.replace("\\", "")
        assert not any(advice in text for advice in WRONG_ADVICE), text
    assert markdown.index("Most likely cause") < markdown.index("Passed")
    assert "<dt>Fix</dt>" in page


def test_a_blank_notebook_is_one_line():
    rows = [_blank("bob", "average_gradients"), _blank("bob", "BucketedDDP")]
    markdown, page = feedback_markdown("bob", rows), feedback_html("bob", rows)
    assert markdown.count("Not started") == 1 and "NotImplementedError" in markdown and "A check" not in markdown
    assert page.count("Not started") == 1 and "A check" not in page


def test_the_autograded_notebook_shows_the_same_report():
    cell = {"cell_type": "code", "source": "", "outputs": []}
    _report_cell(cell, _row())
    text = cell["outputs"][0]["text"]
    assert text.startswith("train_with_accumulation: 3 / 11 points") and "Most likely cause (loss_not_divided)" in text
    assert not any(advice in text for advice in WRONG_ADVICE)


def test_the_self_check_prints_the_cause_first(capsys):
    """The notebook's test cell (``check``), with the reference observed live as in the instructor's checkout."""
    from autograder import check
    from autograder.authoring.course import load_course
    from autograder.exercises.beside.define import define_function

    spec = load_course().spec_for_exercise(EX)
    source = variant_modules()[EX].WRONG["no_division_by_k"][0]
    fn = define_function([("setup", c) for c in spec.setup_code] + [("student cell", source)], EX)
    assert check(EX, fn) == 3.0
    printed = capsys.readouterr().out
    assert printed.splitlines()[1].strip().startswith("Most likely cause (loss_not_divided)"), printed
    assert not any(advice in printed for advice in WRONG_ADVICE)
