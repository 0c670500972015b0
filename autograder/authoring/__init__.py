"""The instructor's tools (instructor only): the course read from ``solutions/``, the student notebooks and the
README's tables generated from it, the reference observations that ship to students, and the student kit."""
