"""`make lab` in a fresh shell (issue 27): formgrader answers on its first open.

nbgrader's formgrader runs ``alembic`` from PATH when it opens the gradebook; a shell that never activated .venv
has no ``alembic`` on PATH, and the first ``/formgrader/api/assignments`` answered 500 until a reload.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from browser_helpers import free_port, makefile_lab_path
from nbgrader_cli import REPO

BARE_PATH = "/usr/local/bin:/usr/bin:/bin"  # a fresh shell: no venv activated


def test_make_lab_puts_the_venv_bin_on_jupyters_path():
    found = shutil.which("alembic", path=makefile_lab_path(BARE_PATH))
    assert found and Path(found).parent == Path(sys.prefix) / "bin", found


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def test_formgrader_answers_on_the_first_open_from_make_lab(tmp_path):
    """The real `make lab` (this interpreter's venv as VENV, never reinstalled), from a shell with a bare PATH."""
    if not shutil.which("make"):
        pytest.skip("no `make` on PATH")
    port, token = free_port(), "first-open"
    config = tmp_path / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text('{"ServerApp": {"open_browser": false}}')
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    course = Path(tempfile.mkdtemp(prefix="make-lab-", dir=REPO / "test-artifacts"))  # under the server's root
    env = {"HOME": str(tmp_path), "PATH": BARE_PATH, "JUPYTER_TOKEN": token, "JUPYTER_CONFIG_DIR": str(config),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "NBGRADER_COURSE_ROOT": str(course), "NBGRADER_EXCHANGE": str(tmp_path / "exchange"),
           "PYTHONPATH": str(REPO)}
    venv = os.path.relpath(sys.prefix, REPO)  # as the Makefile's own default (.venv) is: relative
    make = [shutil.which("make"), "-o", f"{venv}/.installed", "lab", f"VENV={venv}", f"PORT={port}"]
    log = tmp_path / "lab.log"
    with open(log, "w") as out:
        server = subprocess.Popen(make, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if _get(f"http://127.0.0.1:{port}/api/status?token={token}")[0] == 200:
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"`make lab` did not serve within 90 s:\n{log.read_text()[-3000:]}")
        status, body = _get(f"http://127.0.0.1:{port}/formgrader/api/assignments?token={token}")
        assert status == 200 and '"name": "lesson1"' in body, f"{status}\n{log.read_text()[-3000:]}"
        # no "get notified about Jupyter news?" pop-up over the start page, no update check: Lab's defaults say so
        status, body = _get(f"http://127.0.0.1:{port}/lab/api/settings/@jupyterlab/apputils-extension:notification"
                            f"?token={token}")
        defaults = json.loads(body)["schema"]["properties"]
        assert status == 200 and defaults["fetchNews"]["default"] == "false", body[:2000]
        assert defaults["checkForUpdates"]["default"] is False, body[:2000]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 15)
            server.wait(30)
        shutil.rmtree(course, ignore_errors=True)
