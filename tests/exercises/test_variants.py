"""Every grader check fails on a plausible wrong answer, and valid styles score full marks, on the public
scenarios (salt 0: the notebook's self-check) and on held-out ones (the class grader's salts).

The variants live in tests/variants/<exercise>.py; each wrong one names the checks it must fail, or says
``EVERY_CHECK`` when it must score 0 in total (a constant, a function that does nothing).
"""
import json

import pytest
from conftest import grade_source, reference_observation, variant_modules
from variants import EVERY_CHECK, HELD_OUT_SALTS, SALTS, variant_marks, variant_salts

from autograder.exercises import get_exercise
from autograder.exercises.beside.observing import observe
from autograder.selfcheck.recorded import load_recorded

CASES = [pytest.param(ex, kind, name, salt, marks=variant_marks(module, kind, index, name, salt),
                      id=f"{ex}-{kind.lower()}-{name}-salt{salt}")
         for ex, module in variant_modules().items()
         for kind in ("CORRECT", "WRONG") for index, name in enumerate(getattr(module, kind))
         for salt in variant_salts(module, kind, index, name)]


def exercise_cases(exercise: str):
    return get_exercise(exercise).cases


@pytest.mark.parametrize("exercise,kind,name,salt", CASES)
def test_variant(exercise, kind, name, salt):
    entry = getattr(variant_modules()[exercise], kind)[name]
    if kind == "CORRECT":
        results = grade_source(exercise, entry, salt)
        failed = [f"{r.title}: {r.feedback}" for r in results if not r.passed]
        assert not failed, f"a correct variant lost marks: {failed}"
        return
    source, must_fail = entry
    results = grade_source(exercise, source, salt)
    assert sum(r.score for r in results) < sum(r.points for r in results), "a wrong variant scored full marks"
    if must_fail == EVERY_CHECK:
        assert [r.title for r in results if r.score] == [], "this submission must earn nothing"
    for phrase in [] if must_fail == EVERY_CHECK else must_fail:
        matching = [r for r in results if phrase in r.title]
        assert matching, f"no check title contains {phrase!r}"
        assert any(not r.passed for r in matching), f"the check about {phrase!r} did not catch this mistake"
    for r in results:
        if not r.passed:
            assert r.feedback.endswith((".", ")", "!")) and len(r.feedback) < 400, "feedback must be one plain sentence"


@pytest.mark.slow  # observes every reference on two held-out salts
@pytest.mark.parametrize("exercise", sorted(variant_modules()))
def test_replaying_the_shipped_reference_earns_nothing(exercise):
    """The student kit ships the reference's observation of the public scenarios. Replayed as a student's
    observation against held-out scenarios (what a student who replaces `observe` could send), it earns nothing."""
    shipped = load_recorded(exercise).observation
    for salt in HELD_OUT_SALTS:
        results = get_exercise(exercise).grade(shipped, reference_observation(exercise, salt))
        assert [r.title for r in results if r.score] == [], f"salt {salt}"


@pytest.mark.parametrize("exercise", sorted(variant_modules()))
def test_salts_give_their_own_scenarios(exercise):
    """Salt 0 is the public scenarios; each other salt gives other ones, the same on every call."""
    cases = exercise_cases(exercise)
    assert cases(0) == cases(0) and cases(1) == cases(1)
    seen = [cases(salt) for salt in (0, *HELD_OUT_SALTS, 12345)]
    assert all(a != b for i, a in enumerate(seen) for b in seen[i + 1:])
    assert all(case["what"] for found in seen for case in found.values())


@pytest.mark.parametrize("salt", SALTS)
def test_the_template_exercise_works(salt):
    """autograder/exercises/_template/ with its suite tests/variants/_template.py: copy both, and they work."""
    from variants import _template as suite

    from autograder.exercises._template import EXERCISE
    from autograder.exercises.beside.define import define_function

    def observed(source, as_reference=False):
        fn = define_function([("setup", suite.SETUP), ("cell", source)], EXERCISE.name)
        return json.loads(json.dumps(observe(EXERCISE, fn, salt=salt, as_reference=as_reference)))

    reference = observed(suite.REFERENCE, as_reference=True)
    for name, source in suite.CORRECT.items():
        assert [r.title for r in EXERCISE.grade(observed(source), reference) if not r.passed] == [], name
    for name, (source, must_fail) in suite.WRONG.items():
        results = EXERCISE.grade(observed(source), reference)
        failed = [r.title for r in results if not r.passed]
        assert failed == [r.title for r in results] if must_fail == EVERY_CHECK else \
            all(any(phrase in title for title in failed) for phrase in must_fail), name


@pytest.mark.parametrize("exercise", sorted(variant_modules()))
def test_evidence_names_real_scenarios(exercise):
    """A check's evidence names scenarios every salt has (a typo would silently demand nothing)."""
    cases = exercise_cases(exercise)
    for salt in SALTS:
        names = {key.partition("@")[0] for key in cases(salt)}
        for check in get_exercise(exercise).checks:
            assert set(check.evidence) <= names, (check.title, salt)


def test_every_exercise_has_variants(course):
    missing = sorted(set(course.exercises) - set(variant_modules()))
    assert not missing, f"exercises without a variant suite in tests/variants/: {missing}"
