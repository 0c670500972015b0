"""The graded exercises: one package per exercise, each defining ``EXERCISE`` in its ``__init__``.

An exercise package holds ``cases.py`` (its scenarios and sizes), ``checks.py`` (the verdict: plain Python, no
torch) and ``observe.py`` (what runs next to the student's code: the only module that imports torch, loaded only
there). Adding an exercise = adding a package here; nothing else to register. Names starting with ``_``
(``_template``) are not exercises and are skipped. This registry imports only the pure parts.
"""
import importlib
import pkgutil
from functools import cache

from .exercise import Exercise


@cache
def all_exercises() -> dict[str, Exercise]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or not info.ispkg:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        exercise = getattr(module, "EXERCISE", None)
        if isinstance(exercise, Exercise):
            found[exercise.name] = exercise
    return found


def get_exercise(name: str) -> Exercise:
    try:
        return all_exercises()[name]
    except KeyError:
        raise KeyError(f"no graded exercise called {name!r}; known: {sorted(all_exercises())}") from None
