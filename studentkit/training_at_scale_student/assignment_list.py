"""nbgrader's Assignment List, which outside a class hub says how work is handed in instead of failing.

On a class hub the students' nbgrader config names the course's exchange, a folder that exists: the Assignment
List is nbgrader's own. Anywhere else (a laptop, ``training-at-scale lab``) there is no exchange, and nbgrader's
list answered "Error fetching courses!" and three exchange errors. There, this server extension answers the
list's two requests itself: one course, and instead of its assignments the sentence ``NOT_ON_A_HUB`` (the list
shows it under each of its three headings). Fetch, submit and the version check stay nbgrader's.

Enabled in place of ``nbgrader.server_extensions.assignment_list`` by the kit's Jupyter settings
(``jupyter_server_config.d/training-at-scale-student.json``).
"""
import json
import os

from jupyter_server.utils import url_path_join
from nbgrader.exchange import ExchangeFactory
from nbgrader.server_extensions.assignment_list import handlers as nbgrader_list
from tornado import web

COURSE_ID = "training-at-scale"
NOT_ON_A_HUB = ("Not on a class hub: there is nothing to fetch or submit here. Hand in by uploading your .ipynb "
                "file to your course's LMS, without renaming it.")


def exchange_exists(manager) -> bool:
    """Whether nbgrader's configured exchange is there (a custom exchange without a root folder counts as there)."""
    with manager.get_assignment_dir_config() as config:
        root = getattr(ExchangeFactory(config=config).List(config=config), "root", None)
    return root is None or os.path.isdir(root)


class CourseList(nbgrader_list.CourseListHandler):
    @web.authenticated
    def get(self):
        if exchange_exists(self.manager):
            return super().get()
        self.finish(json.dumps({"success": True, "value": [COURSE_ID]}))


class AssignmentList(nbgrader_list.AssignmentListHandler):
    @web.authenticated
    def get(self):
        if exchange_exists(self.manager):
            return super().get()
        self.finish(json.dumps({"success": False, "value": NOT_ON_A_HUB}))


def _jupyter_server_extension_points():
    return [{"module": "training_at_scale_student.assignment_list"}]


def _load_jupyter_server_extension(serverapp):
    base = serverapp.web_app.settings["base_url"]
    # registered before nbgrader's own handlers, so these two answer first
    serverapp.web_app.add_handlers(".*$", [(url_path_join(base, "courses"), CourseList),
                                           (url_path_join(base, "assignments"), AssignmentList)])
    nbgrader_list.load_jupyter_server_extension(serverapp)
