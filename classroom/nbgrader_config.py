"""nbgrader configuration of the course.

source  = solutions/  (instructor notebooks, the single source of truth)
release = notebooks/  (student notebooks, generated: `python -m autograder generate`)
Everything nbgrader creates while grading (gradebook.db, submitted/, autograded/, feedback/,
exchange/) lives next to this file and is not committed.
"""
import os
from pathlib import Path

c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

c.CourseDirectory.course_id = "training-at-scale"
# NBGRADER_COURSE_ROOT moves the instructor's state elsewhere (the tests use a temporary folder).
c.CourseDirectory.root = os.environ.get("NBGRADER_COURSE_ROOT", str(HERE))
c.CourseDirectory.source_directory = str(REPO / "solutions")
c.CourseDirectory.release_directory = str(REPO / "notebooks")
# Students and instructors on one machine share this exchange; on JupyterHub point it at a shared folder.
c.Exchange.root = os.environ.get("NBGRADER_EXCHANGE", str(HERE / "exchange"))

# Lesson cells measure and plot; a test cell trains tiny models (a few seconds, multi-process in Lesson 3).
c.ExecutePreprocessor.timeout = 180
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
