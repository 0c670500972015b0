"""FusedLayerNorm (Lesson 10): the class grader runs Triton's interpreter inside its sandbox, and the grader's own
kernel launches see what a student's wrapper would hide.

Class grading (held-out sizes, sandboxed workers) gives the reference full marks, the released notebook 0 and each
named mistake its cause; grades.csv's cause column is the diagnosis. The guards: a kernel that writes one element
past a row is caught even when its values are right.
"""
import pytest
from submission_factory import grade_one_exercise_class
from variants.fused_layer_norm import REFERENCE, WRONG, edit

from autograder.authoring.course import load_course
from autograder.exercises import get_exercise
from autograder.exercises.beside.observing import observe

NB, EX = "10_triton_kernels.ipynb", "FusedLayerNorm"
# values right, one element written past each row's end: only the guards can tell
WRITES_ONE_PAST = edit(REFERENCE, ("tl.store(dx_ptr + start_of_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)",
                                   "tl.store(dx_ptr + start_of_row + cols, dx.to(dx_ptr.dtype.element_ty), "
                                   "mask=cols <= n_cols)"))


@pytest.mark.slow
def test_class_grading_runs_the_interpreter_in_the_sandbox(tmp_path):
    rows = grade_one_exercise_class(tmp_path, NB, EX, {
        "ada": REFERENCE, "bob": None,
        "cy": WRONG["backward_without_the_mean_term"][0], "dee": WRONG["no_mask_on_the_last_block"][0]})
    full = load_course().notebooks[NB].test_points[EX]
    scores = {student: float(row["score"]) for student, row in rows.items()}
    assert scores["ada"] == full and scores["bob"] == 0, rows
    assert scores["cy"] < full and scores["dee"] < full, rows
    assert rows["cy"]["cause"] == "backward_without_the_mean_term", rows["cy"]
    assert rows["dee"]["cause"] == "no_mask_on_the_last_block", rows["dee"]


def test_a_write_one_element_past_a_row_is_caught_by_the_guards():
    from autograder.exercises.beside.define import define_function

    spec = load_course().spec_for_exercise(EX)
    fn = define_function([("setup", c) for c in spec.setup_code] + [("student cell", WRITES_ONE_PAST)], EX)
    scenarios = observe(get_exercise(EX), fn, salt=0)["scenarios"]
    assert scenarios["backward"]["guards"]["backward dx"] is False
    assert all(scenarios["backward"]["guards"][f"backward {name}"] for name in ("dy", "x", "w", "dw", "db"))
    assert scenarios["forward"]["guards"] == {f"forward {name}": True for name in
                                              ("x", "w", "b", "y", "mean", "rstd")}


@pytest.mark.slow  # every variant observed twice: about a minute
def test_the_kits_self_check_gives_every_variant_the_graders_score():
    """A student's test cell (the shipped reference file, no solutions/) scores each variant as the grader does on
    the public scenarios."""
    import contextlib
    import io

    from conftest import grade_source
    from variants import fused_layer_norm as suite

    from autograder.exercises.beside.define import define_function
    from autograder.selfcheck import check

    spec = load_course().spec_for_exercise(EX)
    sources = {**suite.CORRECT, **{name: source for name, (source, _) in suite.WRONG.items()}}
    for name, source in sources.items():
        fn = define_function([("setup", c) for c in spec.setup_code] + [("student cell", source)], EX)
        with contextlib.redirect_stdout(io.StringIO()):
            kit = check(EX, fn)
        assert kit == sum(r.score for r in grade_source(EX, source, 0)), name
