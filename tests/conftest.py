"""Shared fixtures: grading a piece of source in-process, the way the checks see it."""
import importlib
import os
import pkgutil
import sys
from functools import cache
from pathlib import Path

import pytest
from processes import subreaper  # noqa: F401  (a fixture for every test module)

from autograder.course import load_course
from autograder.define import define_function
from autograder.exercises import get_exercise
from autograder.reference import reference_function

REPO = Path(__file__).resolve().parent.parent
# Tests start nbgrader, jupyter and torchrun as programs, and nbgrader itself runs `alembic`: find them in
# this interpreter's environment even when it was not activated (`make test` runs .venv/bin/python).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@cache
def reference_observation(exercise: str) -> dict:
    return get_exercise(exercise).observe_as_reference(reference_function(exercise))


def grade_source(exercise: str, source: str):
    """Check results for a student cell's source (after the notebook's setup cells), in this process."""
    spec = load_course().spec_for_exercise(exercise)
    fn = define_function([("setup", c) for c in spec.setup_code] + [("student cell", source)], exercise)
    ex = get_exercise(exercise)
    reference = reference_observation(exercise)  # before the variant runs: it may change global state
    return ex.grade(ex.observe(fn), reference)


def variant_modules() -> dict[str, object]:
    """tests/variants/<exercise>.py for every exercise that has one."""
    import variants

    return {m.name: importlib.import_module(f"variants.{m.name}") for m in pkgutil.iter_modules(variants.__path__)}


@pytest.fixture(scope="session")
def course():
    return load_course()


@pytest.fixture(scope="session")
def student_kit(tmp_path_factory):
    """The student kit, built by the instructor's command (``python -m autograder student-kit``)."""
    from kit_helpers import build_kit

    return build_kit(tmp_path_factory.mktemp("student-kit") / "kit")


@pytest.fixture(scope="session")
def installed_kit(student_kit, tmp_path_factory):
    """The kit installed into a fresh virtual environment in an empty folder, as a student installs it."""
    from kit_helpers import install_kit

    return install_kit(student_kit, tmp_path_factory.mktemp("student-machine"))
