"""Registry of graded exercises: one module per exercise, each defining ``EXERCISE``.

Adding an exercise = adding a module here; nothing else to register. Modules whose name starts with ``_``
(``_template.py``) are not exercises and are skipped.
"""
import importlib
import pkgutil
from functools import cache

from ..exercise import Exercise


@cache
def all_exercises() -> dict[str, Exercise]:
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
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
