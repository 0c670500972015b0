"""Every grader check fails on a plausible wrong answer, and valid styles score full marks.

The variants live in tests/variants/<exercise>.py; each wrong one names the checks it must fail.
"""
import pytest
from conftest import grade_source, variant_modules

CASES = [(ex, kind, name) for ex, module in variant_modules().items()
         for kind in ("CORRECT", "WRONG") for name in getattr(module, kind)]


@pytest.mark.parametrize("exercise,kind,name", CASES, ids=[f"{e}-{k.lower()}-{n}" for e, k, n in CASES])
def test_variant(exercise, kind, name):
    entry = getattr(variant_modules()[exercise], kind)[name]
    if kind == "CORRECT":
        results = grade_source(exercise, entry)
        failed = [f"{r.title}: {r.feedback}" for r in results if not r.passed]
        assert not failed, f"a correct variant lost marks: {failed}"
    else:
        source, must_fail = entry
        results = grade_source(exercise, source)
        assert sum(r.score for r in results) < sum(r.points for r in results), "a wrong variant scored full marks"
        for phrase in must_fail:
            matching = [r for r in results if phrase in r.title]
            assert matching, f"no check title contains {phrase!r}"
            assert any(not r.passed for r in matching), f"the check about {phrase!r} did not catch this mistake"
        for r in results:
            if not r.passed:
                assert r.feedback.endswith((".", ")", "!")) and len(r.feedback) < 400, "feedback must be one plain sentence"


def test_every_exercise_has_variants(course):
    missing = sorted(set(course.exercises) - set(variant_modules()))
    assert not missing, f"exercises without a variant suite in tests/variants/: {missing}"
