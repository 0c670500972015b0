# Students' servers on Kubernetes: the course's exchange on the shared volume (the one-server hub writes the same).
c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "training-at-scale"
c.Exchange.root = "/srv/nbgrader/exchange"
