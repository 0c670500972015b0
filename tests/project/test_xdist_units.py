"""How `make test` and `make test-fast` share the tests between their processes (tests/conftest.py): units that keep
shared work together, a few files split test by test, and the costliest units first; the serial steps after them."""
import subprocess
import sys

import pytest
from conftest import COSTLIEST_FIRST, REPO, work_order, work_unit
from xdist.scheduler import LoadScopeScheduling


def test_shared_work_stays_together_and_each_test_alone_is_its_own_unit():
    ring = {work_unit("tests/exercises/test_variants.py::test_variant[ring_attention-wrong-chunk_offsets_wrong-salt1]"),
            work_unit("tests/exercises/test_diagnosis.py::test_every_variant_is_diagnosed_as_itself[ring_attention-x-held-out]"),
            work_unit("tests/exercises/test_known_fails.py::test_the_record_of_what_each_mistake_does_is_current[ring_attention]")}
    assert ring == {"observations:ring_attention"}
    assert work_unit("tests/exercises/test_variants.py::test_variant[train_amp-correct-x-salt0]") == "observations:train_amp"
    assert work_unit("tests/exercises/test_diagnosis.py::test_a_blank_function_gets_one_line") == "observations"
    kit = work_unit("tests/hub/test_browser.py::test_x"), work_unit("tests/authoring/test_student_kit.py::test_y")
    assert kit == ("student-kit", "student-kit")
    ranks = "tests/exercises/test_ranks.py"
    assert work_unit(f"{ranks}::test_a") == work_unit(f"{ranks}::test_b") == ranks
    one, other = "tests/notebooks/test_notebooks.py::test_run[a.ipynb]", "tests/notebooks/test_notebooks.py::test_run[b.ipynb]"
    assert work_unit(one) == one and work_unit(other) == other


def test_the_costliest_units_come_first_and_the_others_keep_their_order():
    lesson = "tests/notebooks/test_nbgrader_lessons.py::test_autograde[lesson3]"
    queue = {"tests/test_b.py": {}, "tests/grader/test_cli.py": {}, "tests/test_a.py": {}, lesson: {}, "observations:x": {}}
    assert list(work_order(queue)) == ["observations:x", lesson, "tests/grader/test_cli.py", "tests/test_b.py", "tests/test_a.py"]
    assert COSTLIEST_FIRST.index("observations") < COSTLIEST_FIRST.index("test_nbgrader_lessons")


def test_xdist_still_has_the_scheduler_methods_conftest_overrides():
    """Private to xdist: the scheduler in conftest.py changes how units are named and the order they are handed out."""
    assert callable(LoadScopeScheduling._split_scope) and callable(LoadScopeScheduling._assign_work_unit)
    assert "workqueue" in LoadScopeScheduling.__init__.__code__.co_names


@pytest.mark.slow
def test_the_serial_steps_collect_every_serial_test():
    """The Makefile's serial steps collect only SERIAL_FILES (the files that say `mark.serial`), not every file: each
    test marked `serial` anywhere must be in one of them, or `make test` would never run it."""
    shown = subprocess.run(["make", "-s", "--no-print-directory", "--eval", "show-serial-files: ; @echo $(SERIAL_FILES)",
                            "show-serial-files"], cwd=REPO, capture_output=True, text=True, check=True)
    listed = set(shown.stdout.split())
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "serial", "-p",
                                "no:cacheprovider", "-o", "addopts="], cwd=REPO, capture_output=True, text=True)
    serial = {line.partition("::")[0] for line in collected.stdout.splitlines() if "::" in line}
    assert serial and serial <= listed, (serial - listed, collected.stdout[-2000:])
