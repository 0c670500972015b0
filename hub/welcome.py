"""A student's first page on the class hub: where the course is and how to fetch it.

A student's JupyterLab works in their home, which holds nothing until they fetch a lesson with nbgrader's
Assignment List, and an empty Launcher points nowhere. So a student's server opens ``WELCOME_FILE`` (the
spawner's default URL, ``STUDENT_FIRST_PAGE``; rendered, not in an editor: ``STUDENT_LAB_OVERRIDES``), which the
spawner writes into the home, as the student, whenever it is not there. It never replaces a file of theirs.
"""
import os

WELCOME_FILE = "WELCOME.md"
STUDENT_FIRST_PAGE = f"/lab/tree/{WELCOME_FILE}"
# JupyterLab opens Markdown files in its text editor unless told otherwise
STUDENT_LAB_OVERRIDES = {"@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"markdown": "Markdown Preview"}}}

WELCOME_TEXT = """\
# Training at Scale: start here

Your lessons are not in this folder yet: each one is handed out, and handed in, with nbgrader's Assignment List.

1. In the menu bar at the top, open **Nbgrader → Assignment List**.
2. Under **Released assignments**, press **Fetch** next to `lesson1` (the next lessons appear there as your
   instructor releases them). The lesson arrives as the folder `lesson1/` in the file browser on the left.
3. Open the notebook in that folder and run it from the top (**Run → Run All Cells**). Each exercise is a function
   in a cell marked `# YOUR CODE HERE`; the test cell below it checks your function, and **Validate** in the
   notebook's toolbar runs the whole notebook the way the grader will.
4. When you are done, press **Submit** next to the lesson in the Assignment List (again as often as you like: the
   latest submission counts). Your instructor's feedback comes back there too, with **Fetch Feedback**.

This page is `WELCOME.md` in your home folder; when it is missing, your server puts it back when it starts.
"""


def write_welcome(home: str) -> None:
    """Create ``home/WELCOME_FILE`` unless something of that name is there (a file, a folder, a link: kept as it
    is, never followed). Runs as the student, in the spawner's pre-exec step."""
    try:
        fd = os.open(os.path.join(home, WELCOME_FILE), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(WELCOME_TEXT)
