"""The sandbox's tiny /etc is the grader's own temporary folder: gone when the grader exits, kept while it runs."""
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import os
from autograder.grader.sandbox.launch import _etc
folder = _etc()
child = os.fork()
if child == 0:
    raise SystemExit(0)       # a forked worker exiting normally runs the inherited atexit hooks
os.waitpid(child, 0)
print(folder, os.path.isdir(folder), flush=True)
"""


def test_the_etc_folder_outlives_a_forked_worker_and_not_the_grader():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout.split()
    folder, alive_after_child = out[0], out[1]
    assert alive_after_child == "True"
    assert not Path(folder).exists()
