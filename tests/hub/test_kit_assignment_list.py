"""The student kit's Assignment List outside a class hub says that work is handed in through the LMS (issue 27).

Before, without an nbgrader exchange it showed "Error fetching courses!" and the exchange error three times. A real
Jupyter server with the kit's server settings answers the list's requests: without an exchange, one course and the
kit's sentence; once the configured exchange exists (as on the class hub), nbgrader's own answers.
"""
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from browser_helpers import free_port

REPO = Path(__file__).resolve().parents[2]
KIT_SERVER_SETTINGS = REPO / "studentkit" / "jupyter-config" / "jupyter_server_config.d" / "training-at-scale-student.json"
sys.path.insert(0, str(REPO / "studentkit"))
from training_at_scale_student.assignment_list import NOT_ON_A_HUB  # noqa: E402


def test_the_kit_serves_its_assignment_list_in_place_of_nbgraders():
    extensions = json.loads(KIT_SERVER_SETTINGS.read_text())["ServerApp"]["jpserver_extensions"]
    assert extensions["nbgrader.server_extensions.assignment_list"] is False
    assert extensions["training_at_scale_student.assignment_list"] is True
    assert "LMS" in NOT_ON_A_HUB and "Error" not in NOT_ON_A_HUB


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kit-server")
    config, exchange = tmp / "config", tmp / "exchange"
    (config / "jupyter_server_config.d").mkdir(parents=True)
    (config / "jupyter_server_config.d" / "training-at-scale-student.json").write_text(KIT_SERVER_SETTINGS.read_text())
    (config / "nbgrader_config.json").write_text(json.dumps({"Exchange": {"root": str(exchange)}}))
    (tmp / "home").mkdir()
    port, token = free_port(), secrets.token_hex(8)
    # JUPYTER_PREFER_ENV_PATH=0: this config folder over the venv's etc/jupyter (where nbgrader enables its own list;
    # in the kit, its settings sit next to nbgrader's there and are read after them)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_PREFER_ENV_PATH": "0", "JUPYTER_DATA_DIR": str(tmp / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "HOME": str(tmp / "home"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "studentkit"), str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1", "--no-browser",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp / 'home'}", "--ServerApp.port_retries=0"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = open(tmp / "server.log", "w")
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2):
                break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail(f"the server did not start:\n{(tmp / 'server.log').read_text()[-3000:]}")
            time.sleep(0.3)

    def get(path: str) -> dict:
        with urllib.request.urlopen(f"{url}/{path}{'&' if '?' in path else '?'}token={token}", timeout=30) as reply:
            return json.loads(reply.read())

    yield get, exchange, tmp / "server.log"
    process.terminate()
    process.wait(20)
    log.close()


def test_without_an_exchange_the_list_says_to_hand_in_through_the_lms(server):
    get, exchange, log = server
    assert not exchange.exists()
    assert get("courses") == {"success": True, "value": ["training-at-scale"]}, log.read_text()[-2000:]
    assert get("assignments?course_id=training-at-scale") == {"success": False, "value": NOT_ON_A_HUB}
    assert not exchange.exists(), "the list must not create an exchange"


def test_with_an_exchange_it_is_nbgraders_list(server):
    get, exchange, log = server
    exchange.mkdir()
    try:
        assert get("courses") == {"success": True, "value": []}, log.read_text()[-2000:]  # nbgrader's: no course yet
        assert get("nbgrader_version?version=0")["success"] is False  # nbgrader's own handlers are there too
    finally:
        exchange.rmdir()
