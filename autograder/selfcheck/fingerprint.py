"""One fingerprint of code: was a saved result made by the code that runs now?

Three things are saved and reused, and each is stale once code that could change it changes: a resumed grading
run's rows (``grader/batch.py``), the reference observations that ship to students (``selfcheck/recorded.py``) and
the sandbox probe's answer (``grader/sandbox/probe.py``). Each asks ``code_fingerprint`` over the files it depends
on, listed by folder rather than by hand, so a module added later is covered without anyone remembering it.
Files are named relative to the folder above ``autograder/``, so a checkout and an installed kit agree.
"""
import ast
import hashlib
from collections.abc import Iterable
from importlib.util import find_spec
from pathlib import Path

AUTOGRADER = Path(__file__).resolve().parent.parent
EXERCISES = AUTOGRADER / "exercises"
SOURCES = (".py", ".j2")  # code, and the class report's template
# Exercise modules that word the feedback but change no observation and no score: a reference stays valid.
WORDING_ONLY = ("mistakes.py", "diagnosis.py", "localise.py", "known_fails.py", "feedback.py", "verdict.py")


def code_fingerprint(files: Iterable[Path]) -> str:
    """Hash of the files' names and bytes, in a fixed order."""
    sha = hashlib.sha256()
    for path in sorted(set(files), key=_name):
        sha.update(_name(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return sha.hexdigest()[:16]


def sources(folder: Path) -> list[Path]:
    """Every code file under ``folder``."""
    return [p for p in folder.rglob("*") if p.suffix in SOURCES and p.is_file() and "__pycache__" not in p.parts]


def coursekit_folder() -> Path | None:
    """The lessons' helpers, found without importing them (importing coursekit imports torch)."""
    spec = find_spec("coursekit")
    return Path(spec.origin).parent if spec and spec.origin else None


def grader_code() -> list[Path]:
    """Everything that can change a grading row: the whole package, and the helpers observers import."""
    folder = coursekit_folder()
    return sources(AUTOGRADER) + (sources(folder) if folder else [])


def exercise_code(package: str) -> list[Path]:
    """What one exercise's observations and scores depend on: its own package and the shared exercise modules
    (wording-only ones left out), and the coursekit modules any of them imports, followed through coursekit."""
    own = EXERCISES.joinpath(*package.split(".")[2:])
    shared = [p for folder in (EXERCISES, EXERCISES / "beside", EXERCISES / "judging") for p in folder.glob("*.py")
              if p.name not in WORDING_ONLY]
    files = shared + [p for p in own.glob("*.py") if p.name not in WORDING_ONLY]
    return files + _coursekit_imports(files)


def _coursekit_imports(starts: list[Path]) -> list[Path]:
    folder = coursekit_folder()
    if folder is None:
        return []
    found, todo = set(), list(starts)
    while todo:
        path = todo.pop()
        for name in _imported(path, inside_coursekit=path.is_relative_to(folder)):
            if name == "coursekit" or name.startswith("coursekit."):
                parts = name.split(".")[1:]
                for module in (folder.joinpath(*parts, "__init__.py"), folder.joinpath(*parts).with_suffix(".py"),
                               folder / "__init__.py"):
                    if module.is_file() and module not in found:
                        found.add(module)
                        todo.append(module)
    return sorted(found)


def _imported(path: Path, inside_coursekit: bool) -> set[str]:
    """Absolute module names ``path`` imports (relative imports inside coursekit resolved to ``coursekit.x``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if not inside_coursekit:
                    continue
                base = "coursekit" + (f".{base}" if base else "")
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def _name(path: Path) -> str:
    path = path.resolve()
    for root in (AUTOGRADER.parent, *(f.parent for f in [coursekit_folder()] if f)):
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return path.name
