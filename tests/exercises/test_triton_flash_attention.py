"""TritonFlashAttention (Lesson 10): the grader's own launches of the student's kernel see what a wrapper hides.

Class grading (held-out sizes, sandboxed workers) gives the reference full marks, the released notebook 0 and each
named mistake its cause. The causal-tiles launches: a kernel that loads a key tile after the diagonal gets the
grader's NaN into o even when it masks those scores, so the skipped tiles are read from values, not from a count
taken inside the student's process.
"""
import pytest
from submission_factory import grade_one_exercise_class
from variants.triton_flash_attention import REFERENCE, WRONG, edit

from autograder.authoring.course import load_course
from autograder.exercises import get_exercise
from autograder.exercises.beside.observing import observe

NB, EX = "10_triton_kernels.ipynb", "TritonFlashAttention"
# values right, o's store unmasked: the last query tile writes past the end of o, only the guards can tell
STORES_PAST_O = edit(REFERENCE, ("o.to(o_ptr.dtype.element_ty), mask=rows[:, None] < n)",
                                 "o.to(o_ptr.dtype.element_ty))"))


def observed(source: str) -> dict:
    from autograder.exercises.beside.define import define_function

    spec = load_course().spec_for_exercise(EX)
    fn = define_function([("setup", c) for c in spec.setup_code] + [("student cell", source)], EX)
    return observe(get_exercise(EX), fn, salt=0)["scenarios"]


def test_a_store_past_the_end_of_o_is_caught_by_the_guards():
    scenarios = observed(STORES_PAST_O)
    assert scenarios["full"]["guards"]["o"] is False
    assert all(scenarios["full"]["guards"][name] for name in ("q", "k", "v", "L"))


def test_skipped_causal_tiles_are_read_from_nan_past_the_diagonal():
    """The kernel that loops over every key tile has right causal values, and NaN in the per-tile launches (every
    query tile but the last, whose keys all lie at or before its diagonal)."""
    import math

    skipped, loaded = observed(REFERENCE), observed(WRONG["causal_tiles_not_skipped"][0])
    assert skipped["causal"]["o"] == pytest.approx(loaded["causal"]["o"], rel=1e-5, abs=1e-6)
    c = skipped["causal_tiles"]["case"]
    last_tile = (math.ceil(c["n"] / c["block_m"]) - 1) * c["block_m"] * c["d"]
    assert all(math.isfinite(x) for x in skipped["causal_tiles"]["o"])
    assert all(math.isnan(x) for x in loaded["causal_tiles"]["o"][:last_tile])
    assert all(math.isfinite(x) for x in loaded["causal_tiles"]["o"][last_tile:])


@pytest.mark.slow
def test_class_grading_runs_the_interpreter_in_the_sandbox(tmp_path):
    rows = grade_one_exercise_class(tmp_path, NB, EX, {
        "ada": REFERENCE, "bob": None,
        "cy": WRONG["no_rescale_of_the_output"][0], "dee": WRONG["causal_tiles_not_skipped"][0]})
    full = load_course().notebooks[NB].test_points[EX]
    scores = {student: float(row["score"]) for student, row in rows.items()}
    assert scores["ada"] == full and scores["bob"] == 0, rows
    assert scores["cy"] < full and scores["dee"] < full, rows
    assert rows["cy"]["cause"] == "no_rescale_of_the_output", rows["cy"]
    assert rows["dee"]["cause"] == "causal_tiles_not_skipped", rows["dee"]


@pytest.mark.slow  # every variant observed twice: about a minute
def test_the_kits_self_check_gives_every_variant_the_graders_score():
    """A student's test cell (the shipped reference file, no solutions/) scores each variant as the grader does on
    the public scenarios."""
    import contextlib
    import io

    from conftest import grade_source
    from variants import triton_flash_attention as suite

    from autograder.exercises.beside.define import define_function
    from autograder.selfcheck import check

    spec = load_course().spec_for_exercise(EX)
    sources = {**suite.CORRECT, **{name: source for name, (source, _) in suite.WRONG.items()}}
    for name, source in sources.items():
        fn = define_function([("setup", c) for c in spec.setup_code] + [("student cell", source)], EX)
        with contextlib.redirect_stdout(io.StringIO()):
            kit = check(EX, fn)
        assert kit == sum(r.score for r in grade_source(EX, source, 0)), name
