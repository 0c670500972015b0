"""Shared fixtures: grading a piece of source in-process, the way the checks see it."""
import importlib
import json
import os
import pkgutil
import sys
import zlib
from collections import OrderedDict
from functools import cache
from pathlib import Path

import pytest
from processes import subreaper  # noqa: F401  (a fixture for every test module)

from autograder.authoring.course import load_course, reference_function
from autograder.exercises import all_exercises, get_exercise
from autograder.exercises.beside.define import define_function
from autograder.exercises.beside.observing import observe
from autograder.exercises.judging.diagnosis import diagnose

REPO = Path(__file__).resolve().parent.parent
# Tests start nbgrader, jupyter and torchrun as programs, and nbgrader itself runs `alembic`: find them in
# this interpreter's environment even when it was not activated (`make test` runs .venv/bin/python).
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@cache
def reference_observation(exercise: str, salt: int = 0) -> dict:
    """The reference's observation as the class grader receives it from its worker: JSON (a fresh copy each call)."""
    return json.loads(_reference_json(exercise, salt))


@cache
def _reference_json(exercise: str, salt: int) -> str:
    """Observed once per session: rank-spawning references cost seconds, and every variant is graded against one."""
    return json.dumps(observe(get_exercise(exercise), reference_function(exercise), salt=salt, as_reference=True))


def grade_source(exercise: str, source: str, salt: int = 0):
    """Check results for a student cell's source (after the notebook's setup cells), in this process.

    ``salt`` 0 observes the public scenarios (the notebook's self-check), any other salt held-out ones (the
    class grader's). Both observations pass through JSON, as they do in class grading.
    """
    reference = reference_observation(exercise, salt)  # before the variant runs: it may change global state
    return get_exercise(exercise).grade(student_observation(exercise, source, salt), reference)


def student_observation(exercise: str, source: str, salt: int = 0) -> dict:
    """A student cell's observation as the class grader receives it (JSON; a fresh copy each call)."""
    return json.loads(_student_json(exercise, source, salt))


@cache
def _student_json(exercise: str, source: str, salt: int) -> str:
    """Observed once per session: test_variants.py (scores) and test_diagnosis.py (causes) judge the same runs."""
    reference_observation(exercise, salt)  # the reference first: a variant may change global state
    spec = load_course().spec_for_exercise(exercise)
    fn = define_function([("setup", c) for c in spec.setup_code] + [("student cell", source)], exercise)
    return json.dumps(observe(get_exercise(exercise), fn, salt=salt))


def observed(exercise: str, source: str, salt: int = 0):
    """(results, diagnosis, student observation) of a student cell, as class grading judges it (through JSON);
    the run is test_variants.py's own (conftest keeps each observation for the session)."""
    ex = get_exercise(exercise)
    reference = reference_observation(exercise, salt)
    student = student_observation(exercise, source, salt)
    results = ex.grade(student, reference)
    return results, diagnose(ex, student, reference, results), student


def variant_modules() -> dict[str, object]:
    """tests/variants/<package>.py for every exercise that has one, by exercise name (a suite is named after its
    exercise's package: ``tensor_parallel_mlp.py`` for ``TensorParallelMLP``)."""
    by_package = {ex.package.rpartition(".")[2]: name for name, ex in all_exercises().items()}
    return {by_package[m.name]: importlib.import_module(f"variants.{m.name}")
            for m in pkgutil.iter_modules(variants_path()) if m.name in by_package}


def variants_path() -> list[str]:
    import variants

    return variants.__path__


# ---- running the suite in two processes (pytest-xdist, ``make test``) ---------------------------------------------

# Files that share expensive session work run in one process: the cached observations above (those of one exercise:
# test_variants scores the runs that test_diagnosis names the causes of), the installed kit.
SHARED_WORK = {"test_variants": "observations", "test_diagnosis": "observations", "test_known_fails": "observations",
               "test_whole_evidence": "observations",
               "test_student_kit": "student-kit", "test_browser": "student-kit", "test_hub_k8s": "student-kit"}
# Files whose tests share no module or session work (one nbgrader course, one notebook run each): each test is a unit
# of its own, so that one file of minutes does not keep one process busy while the other waits.
EACH_TEST_ALONE = {"test_nbgrader_lessons", "test_notebooks"}
# The costliest units first (longest first: the other process takes the short ones meanwhile, and neither ends
# minutes after the other); the rest follow by number of tests, as xdist orders them. Measured with --durations=0.
COSTLIEST_FIRST = ("observations", "student-kit", "test_nbgrader_lessons", "test_nbgrader", "test_cli", "test_notebooks",
                   "test_sharded_optimizer", "test_sandbox_defences", "test_flight_recorder", "test_ring_attention",
                   "test_average_gradients", "test_class_report", "test_checkpointer", "test_fingerprint",
                   "test_tensor_parallel_mlp", "test_expert_parallel_moe", "test_held_out", "test_gpu_evidence")


def pytest_xdist_make_scheduler(config, log):
    """Each test file runs whole in one process (its module fixtures are built once), and the files of SHARED_WORK
    in the same one (the observations one exercise at a time: a test elsewhere only observes again, in its own
    process); the tests of EACH_TEST_ALONE are units of their own; the costliest units start first. (xdist's
    own ``loadgroup`` cannot do it with this pytest: it renames test ids that pytest 9 no longer reads.) The tests
    marked ``serial`` (fork bombs, CPU hogs, a full per-user quota, scans of every process of a uid) run after the
    others, with the machine to themselves (``make test``, ``make test-fast``)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFileAndSharedWork(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not getattr(self, "_costliest_first", False):  # the first assignment: the queue is complete
                self._costliest_first = True
                self.workqueue = work_order(self.workqueue)
            super()._assign_work_unit(node)

    return ByFileAndSharedWork(config, log)


def work_unit(nodeid: str) -> str:
    """The unit a test runs in: its SHARED_WORK name (the observations one exercise at a time: a test's id starts
    with its exercise), its own id (EACH_TEST_ALONE) or its file."""
    path, _, name = nodeid.partition("::")
    stem = Path(path).stem
    if stem in EACH_TEST_ALONE:
        return nodeid
    if SHARED_WORK.get(stem) == "observations":
        exercise = name.partition("[")[2].split("-")[0].rstrip("]")
        return f"observations:{exercise}" if exercise else "observations"
    return SHARED_WORK.get(stem, path)


def work_order(queue: dict) -> OrderedDict:
    """xdist's queue of units (as work_unit names them) with COSTLIEST_FIRST's at the front, in its order."""
    rank = {name: i for i, name in enumerate(COSTLIEST_FIRST)}
    unit_name = lambda unit: Path(unit.split("::", 1)[0]).stem.split(":")[0]
    return OrderedDict(sorted(queue.items(), key=lambda item: rank.get(unit_name(item[0]), len(rank))))


# ---- the any-cpu tier (tests/any_cpu.py): each wrong variant under one of the other kernel levels ---------------

def pytest_configure(config):
    config.addinivalue_line("markers", "one_level(index): a wrong answer; tests/any_cpu.py judges it under one of the "
                                       "other kernel levels, the one its index picks (ANY_CPU_SHARE)")


def pytest_collection_modifyitems(config, items):
    """Under ``ANY_CPU_SHARE=k/n`` (any_cpu.py's k-th of n levels), keep the ``one_level`` tests whose index is k
    modulo n: test_variants.py and test_diagnosis.py mark a variant alike, so they still judge the same run. A mark
    without an index (test_localisation.py) takes a checksum of the test's parameters (else its name): the tests of
    one cell share its index, and its observation."""
    share = os.environ.get("ANY_CPU_SHARE")
    if not share:
        return
    k, n = map(int, share.split("/"))

    def index(item, mark) -> int:
        return mark.args[0] if mark.args else zlib.crc32((item.nodeid.partition("[")[2] or item.name).encode())

    others = [item for item in items if (mark := item.get_closest_marker("one_level")) and index(item, mark) % n != k]
    if others:
        config.hook.pytest_deselected(items=others)
        dropped = set(map(id, others))
        items[:] = [item for item in items if id(item) not in dropped]


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
