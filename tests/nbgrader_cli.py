"""Running the real nbgrader command line from tests, against the course's nbgrader configuration."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COURSE = REPO / "classroom"
NBGRADER = str(Path(sys.executable).with_name("nbgrader"))


def run(args, cwd, env, check=True, timeout=900) -> subprocess.CompletedProcess:
    """Run a command; with ``check``, fail the test with the tail of its output when it exits non-zero."""
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"{args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done
