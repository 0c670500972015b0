"""Training at Scale, the student kit: the lessons, their helpers and self-checks, without the answers.

``training-at-scale lab`` copies the lessons into a folder of yours (once; your work is never overwritten) and
opens JupyterLab on the start page. The lessons themselves ship inside this package (``course/``).
"""
from importlib.resources import files

__all__ = ["lessons"]


def lessons():
    """The released lessons as shipped in this package (a Traversable folder)."""
    return files(__name__) / "course"
