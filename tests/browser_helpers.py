"""Plumbing for the browser tests: a throw-away copy of the course, a real JupyterLab on it, Chromium.

The JupyterLab server is started with the options of the Makefile's ``lab`` target (the command the README
tells students to run), on a free loopback port with a random token, in a temporary copy of the course laid
out like the repository. nbgrader's state (gradebook.db, submitted/, autograded/, exchange/) and Lab's
settings therefore live in the temporary folder, and the repository is never written to.
"""
import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from nbgrader_cli import NBGRADER, REPO, run

ARTIFACTS = REPO / "test-artifacts" / "browser"
VENV_BIN = Path(sys.executable).parent  # nbgrader runs `alembic` from PATH: the venv's bin must be on it
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]

# Lab settings for a clean, deterministic first start: no news or update pop-ups (they would fetch from the
# internet), and every cell kept in the page so the test sees all outputs without scrolling.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def chromium_executable() -> str:
    """Debian's Chromium, or skip: the tests never download a browser build."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("browser tests skipped: no `chromium` on PATH. Install it from the system package manager "
                "(Debian/Ubuntu: `apt-get install chromium`); the tests do not download a browser.")


def playwright_or_skip():
    """playwright's ``sync_playwright``, or skip."""
    try:
        from playwright.sync_api import sync_playwright as start
    except ImportError:
        pytest.skip("browser tests skipped: Python playwright is not installed (`pip install -e '.[dev]'`).")
    return start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def makefile_lab_command() -> tuple[str, list[str]]:
    """The ``make lab`` recipe: (folder it changes into, the ``--option=value`` arguments of ``jupyter lab``)."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(r"^lab:.*\n((?:\t.*\n?)+)", text, re.MULTILINE)
    assert match, "the Makefile has no `lab:` target: the README's `make lab` cannot work"
    recipe = match.group(1)
    cd = re.search(r"\bcd\s+(\S+)\s*&&", recipe)
    assert cd and "jupyter lab" in recipe, f"`make lab` should `cd` into the course folder and run `jupyter lab`:\n{recipe}"
    return cd.group(1), re.findall(r"--[\w.]+=\S+", recipe.split("jupyter lab", 1)[1])


def makefile_lab_path(path: str) -> str:
    """``PATH`` as ``make lab`` gives it to ``jupyter lab`` (the venv being this interpreter's), from ``path`` without
    this interpreter's bin: formgrader runs ``alembic`` from PATH, so the recipe itself must put the venv on it."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    recipe = re.search(r"^lab:.*\n((?:\t.*\n?)+)", text, re.MULTILINE).group(1)
    bare = os.pathsep.join(p for p in path.split(os.pathsep) if p and Path(p) != VENV_BIN)
    assigned = re.search(r"\bPATH=(?:\"([^\"]*)\"|(\S+))", recipe)
    if not assigned:
        return bare
    venv = {"$(abspath $(VENV))": sys.prefix, "$(CURDIR)/$(VENV)": sys.prefix, "$$PATH": bare}
    return _substitute(assigned.group(1) or assigned.group(2), venv)


def copy_course(dest: Path) -> Path:
    """A copy of the course laid out like the repository; returns its root."""
    skip = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")
    for folder in ("solutions", "notebooks"):
        shutil.copytree(REPO / folder, dest / folder, ignore=skip)
    (dest / "classroom").mkdir(parents=True)
    shutil.copy(REPO / "classroom" / "nbgrader_config.py", dest / "classroom")
    (dest / "Makefile").write_text((REPO / "Makefile").read_text())
    return dest


def course_env(tmp: Path) -> dict:
    """Environment for the server and nbgrader commands: venv on PATH, all of Jupyter's user state in ``tmp``.

    Kernel specs and Lab extensions are found in the venv (sys.prefix), which these variables do not hide.
    """
    env = dict(os.environ)
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
               JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"), JUPYTER_RUNTIME_DIR=str(tmp / "jupyter-runtime"),
               JUPYTER_DATA_DIR=str(tmp / "jupyter-data"),  # nbgrader's submission cache, notebook signatures
               NBGRADER_EXCHANGE=str(tmp / "exchange"), PYTHONUNBUFFERED="1")
    env.pop("COURSE_ROOT", None)  # the kernel's grader reads the reference solutions of the installed course
    settings = tmp / "jupyter-config" / "lab" / "user-settings"
    for name, value in LAB_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    (tmp / "exchange").mkdir(exist_ok=True)
    return env


class LabServer:
    """``jupyter lab`` as ``make lab`` starts it, in a copy of the course, on a free loopback port."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.root = copy_course(tmp / "course-root")
        self.env = course_env(tmp)
        cd, options = makefile_lab_command()
        self.cwd = (self.root / cd).resolve()
        self.port, self.token = free_port(), secrets.token_hex(16)
        substitutions = {"$(PORT)": str(self.port), "$(CURDIR)": str(self.root)}
        options = [_substitute(o, substitutions) for o in options if not o.startswith("--port=")]
        self.default_url = next((o.split("=", 1)[1] for o in options if o.startswith("--LabApp.default_url=")), "/lab")
        self.command = [sys.executable, "-m", "jupyterlab", *options, "--no-browser", "--ip=127.0.0.1",
                        f"--port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                        "--ServerApp.open_browser=False"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI containers run as root; Jupyter refuses without this
            self.command.append("--allow-root")
        self.log_path = tmp / "jupyterlab.log"
        self.process = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def server_env(self) -> dict:
        """The server's environment: PATH as the Makefile's recipe sets it, not as the tests' own commands have it."""
        return {**self.env, "PATH": makefile_lab_path(self.env["PATH"])}

    def __enter__(self):
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(self.command, cwd=self.cwd, env=self.server_env(), stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.__exit__()
                raise RuntimeError(f"jupyter lab exited with code {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"jupyter lab did not answer within 90 s:\n{self.log_tail()}")

    def __exit__(self, *exc):
        if self.process and self.process.poll() is None:
            self.process.terminate()  # the server shuts its kernels down on SIGTERM
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        self.log.close()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def nbgrader(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """A real nbgrader command, run in the course folder the server uses (so it reads the same config)."""
        return run([NBGRADER, *args], self.cwd, self.env, timeout=timeout)


class StudentKitLab(LabServer):
    """``training-at-scale lab`` from an installed student kit (tests/kit_helpers.py), in the student's home: the
    command the kit's README tells students to run, with the token from JUPYTER_TOKEN."""

    def __init__(self, kit, tmp: Path):
        self.tmp, self.kit = tmp, kit
        self.root = kit.home / "training-at-scale"   # where the launcher copies the lessons
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.env = kit.env(JUPYTER_TOKEN=self.token)
        settings = kit.home / ".jupyter" / "lab" / "user-settings"
        for name, value in LAB_SETTINGS.items():
            (settings / name).parent.mkdir(parents=True, exist_ok=True)
            (settings / name).write_text(json.dumps(value))
        self.cwd = kit.home
        self.default_url = "/lab/tree/00-start-here.ipynb"
        self.command = [str(kit.bin / "training-at-scale"), "lab", "--no-browser", f"--port={self.port}"]
        self.log_path = tmp / "student-lab.log"
        self.process = None

    def server_env(self) -> dict:
        return self.env


def _substitute(option: str, values: dict) -> str:
    for key, value in values.items():
        option = option.replace(key, value)
    return option


class Screenshots:
    """Numbered screenshots of one test's steps under test-artifacts/browser/<test>/."""

    def __init__(self, page, test_name: str):
        self.page, self.count = page, 0
        self.folder = ARTIFACTS / test_name
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)

    def take(self, step: str) -> Path:
        self.count += 1
        path = self.folder / f"{self.count:02d}-{step}.png"
        self.page.screenshot(path=str(path))
        return path

    @contextlib.contextmanager
    def step(self, name: str, what: str):
        """Run a step; screenshot it; if it fails, fail the test with what was expected and the screenshot path."""
        problem = None
        try:
            yield
        except Exception as exc:  # playwright's TimeoutError, AssertionError from a check inside the step
            problem = str(exc).split("\nassert ")[0]  # our message, without pytest's expression dump
        if problem is None:
            self.take(name)
        else:
            path = self.take(f"{name}-FAILED")
            pytest.fail(f"{what}: {problem}\n(screenshot: {path})", pytrace=False)


def reference_solution(exercise: str) -> str:
    """The instructor's solution cell as a student would leave it: markers removed."""
    from autograder.authoring.course import load_course

    source = load_course().spec_for_exercise(exercise).reference_code[exercise]
    return "\n".join(line for line in source.splitlines() if "### BEGIN SOLUTION" not in line
                     and "### END SOLUTION" not in line)


def fill_exercise(notebook: dict, exercise: str, source: str) -> dict:
    """The notebook with the exercise cell (by nbgrader grade_id) replaced by ``source``."""
    for cell in notebook["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == exercise:
            cell["source"] = source
            return notebook
    raise KeyError(f"no cell with grade_id {exercise!r}")
