"""A student's first page on the class hub (issue 27), without a hub: the configuration that makes it.

Students logged in to an empty Launcher, with nothing that said the lessons come from Nbgrader → Assignment List.
Now a student's server opens WELCOME.md (written into their home, as them, when missing), rendered as Markdown.
The real page is checked by tests/hub/test_hub.py (slow, root); here: the text, the file's writing, the spawner's
default URL and pre-exec step (JupyterHub's LocalProcessSpawner replaced by a stand-in), the Lab setting.
"""
import asyncio
import os
import sys
import types

import pytest

from autograder.authoring.course import load_course
from hub.deploy import lab_overrides
from hub.settings import HubSettings
from hub.welcome import STUDENT_FIRST_PAGE, WELCOME_FILE, WELCOME_TEXT, write_welcome


def test_the_page_says_where_the_course_is_and_how_to_fetch_it():
    first = sorted(spec.assignment for spec in load_course().notebooks.values())[0]
    for words in ("Nbgrader → Assignment List", "Fetch", f"`{first}`", "Submit", "Validate", "Fetch Feedback"):
        assert words in WELCOME_TEXT, words
    assert STUDENT_FIRST_PAGE == f"/lab/tree/{WELCOME_FILE}"


def test_the_file_is_written_once_and_never_over_the_students_own(tmp_path):
    write_welcome(str(tmp_path))
    page = tmp_path / WELCOME_FILE
    assert page.read_text() == WELCOME_TEXT and (page.stat().st_mode & 0o777) == 0o600
    page.write_text("my notes")
    write_welcome(str(tmp_path))
    assert page.read_text() == "my notes"
    page.unlink()
    target = tmp_path / "elsewhere"
    target.write_text("not yours")
    page.symlink_to(target)
    write_welcome(str(tmp_path))  # a link of that name is left alone, never followed
    assert target.read_text() == "not yours" and page.is_symlink()


def test_students_lab_opens_markdown_rendered():
    student, instructor = lab_overrides("student"), lab_overrides("instructor")
    assert student["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"] == {"markdown": "Markdown Preview"}
    assert "@jupyterlab/docmanager-extension:plugin" not in instructor
    assert student["@jupyterlab/apputils-extension:notification"] == instructor["@jupyterlab/apputils-extension:notification"]


@pytest.fixture
def spawner(monkeypatch, tmp_path):
    """hub.spawner.CourseSpawner over a stand-in for JupyterHub's LocalProcessSpawner (not installed here)."""
    class LocalProcessSpawner:
        def __init__(self, name):
            self.user, self.environment, self.default_url = types.SimpleNamespace(name=name), {}, "/lab"

        async def start(self):
            return "127.0.0.1", 0

        def make_preexec_fn(self, name):
            return lambda: None  # JupyterHub's: setuid to the user

    fake = types.ModuleType("jupyterhub.spawner")
    fake.LocalProcessSpawner = LocalProcessSpawner
    monkeypatch.setitem(sys.modules, "jupyterhub", types.ModuleType("jupyterhub"))
    monkeypatch.setitem(sys.modules, "jupyterhub.spawner", fake)
    monkeypatch.delitem(sys.modules, "hub.spawner", raising=False)
    import hub.spawner as module

    monkeypatch.setitem(sys.modules, "hub.spawner", module)
    monkeypatch.setattr(module.CourseSpawner, "hub_settings", HubSettings(root=str(tmp_path / "srv")))
    monkeypatch.setattr(module.CourseSpawner, "_prepare_limits", lambda self: None)  # no control group to join
    monkeypatch.setattr(os, "umask", lambda mask: 0o022)
    homes = {"alice": tmp_path / "alice", "teacher": tmp_path / "teacher"}
    for home in homes.values():
        home.mkdir()
    monkeypatch.setattr(module.pwd, "getpwnam", lambda name: types.SimpleNamespace(pw_dir=str(homes[name])))
    monkeypatch.setattr(module, "role_of", lambda name, settings: "student" if name == "alice" else "instructor")
    return module.CourseSpawner, homes


@pytest.mark.parametrize("name", ["alice", "teacher"])
def test_a_students_server_opens_the_page_and_puts_it_in_their_home(spawner, name):
    CourseSpawner, homes = spawner
    server = CourseSpawner(name)
    asyncio.run(server.start())
    server.make_preexec_fn(name)()
    if name == "alice":
        assert server.default_url == STUDENT_FIRST_PAGE
        assert (homes[name] / WELCOME_FILE).read_text() == WELCOME_TEXT
    else:  # an instructor's server opens in the course folder, on the Launcher, as before
        assert server.default_url == "/lab" and not (homes[name] / WELCOME_FILE).exists()
