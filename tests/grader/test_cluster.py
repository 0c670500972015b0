"""The same class grading on a Dask cluster (a real local one: scheduler + 2 worker processes)."""
import subprocess
import sys

import pytest
from submission_factory import filled, reference_source, released_notebook, write
from variants.train_with_accumulation import WRONG

NB, EX = "01_gradient_accumulation.ipynb", "train_with_accumulation"
pytestmark = pytest.mark.slow


def test_dask_gives_the_same_grades_file(tmp_path):
    write(tmp_path / "in", "alice", NB, filled(NB, {EX: reference_source(EX)}))
    write(tmp_path / "in", "bob", NB, released_notebook(NB))
    write(tmp_path / "in", "kate", NB, filled(NB, {EX: WRONG["hard_coded_4"][0]}))
    outputs = {}
    for mode, extra in (("threads", []), ("dask", ["--dask", "local"])):
        out = tmp_path / mode
        run = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp_path / "in"), "--out", str(out),
                              "--quiet", *extra], capture_output=True, text=True, timeout=900)
        assert run.returncode == 0, run.stdout + run.stderr
        outputs[mode] = (out / "grades.csv").read_bytes()
    assert outputs["dask"] == outputs["threads"]
    assert b"alice,01_gradient_accumulation.ipynb,train_with_accumulation,11,11" in outputs["dask"]
