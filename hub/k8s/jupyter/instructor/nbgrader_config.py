# Instructors' servers on Kubernetes: the course's nbgrader config, its state on the instructors' volume.
c = get_config()  # noqa: F821
load_subconfig("nbgrader_config.py", path="/opt/course/classroom")  # noqa: F821  (NBGRADER_COURSE_ROOT)
c.Exchange.root = "/srv/nbgrader/exchange"
c.CourseDirectory.groupshared = True  # every instructor can collect, grade and release
# Not here: the one-server hub's owner check at collect (hub/owner_collect.py) needs a user name for each uid, and
# pods have none for the per-user uids. nbgrader's own collect warns about a mismatched owner (see the docs).
