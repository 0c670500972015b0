"""The reference solution of an exercise, taken from the instructor notebook (trusted code only)."""
from functools import cache

from .course import load_course
from .define import define_function


def reference_cells(exercise: str) -> list[tuple[str, str]]:
    spec = load_course().spec_for_exercise(exercise)
    return [(f"setup cell of {spec.name}", code) for code in spec.setup_code] + [
        (f"reference cell {exercise}", spec.reference_code[exercise])]


@cache
def reference_function(exercise: str):
    return define_function(reference_cells(exercise), exercise)
