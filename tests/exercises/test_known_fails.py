"""autograder/exercises/judging/known_fails.py is current: what each catalogued mistake's named variants do, regenerated
from tests/variants, is covered by the record the diagnosis calibrates its confidence with (like ``generate --check``):
nothing goes wrong, in a scenario, a kind or a direction the record lacks (what diagnosis.contradictions compares)."""
import pytest
from conftest import variant_modules
from known_fails import covered, record, seen

from autograder.exercises import get_exercise
from autograder.exercises.judging.diagnosis import catalogue, known

RECORDED = [pytest.param(ex, marks=[pytest.mark.slow] if get_exercise(ex).ranks else [], id=ex)
            for ex in sorted(variant_modules()) if catalogue(get_exercise(ex))]


@pytest.mark.parametrize("exercise", RECORDED)
def test_the_record_of_what_each_mistake_does_is_current(exercise):
    runs = {name: seen(exercise, name) for name in variant_modules()[exercise].WRONG}
    problems = covered(record(exercise, runs), known(get_exercise(exercise)), get_exercise(exercise).ranks)
    assert not problems, f"run: python tests/known_fails.py {exercise}: {problems}"
