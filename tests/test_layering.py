"""Dependencies point one way: the lessons' helpers (coursekit) import nothing of ours; the grader imports the
helpers; benchmarks import the packages, never the tests. Read from the source, import by import."""
import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = {"coursekit", "autograder", "bench", "hub", "tests"}
MAY_IMPORT = {  # package → which of our top-level packages its modules may import
    "coursekit": set(),
    "autograder": {"coursekit"},
    "bench": {"coursekit", "autograder"},
    "hub": {"coursekit", "autograder"},
}


def our_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & OURS


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_imports_point_one_way(package):
    wrong = {}
    for path in sorted((REPO / package).rglob("*.py")):
        bad = our_imports(path) - MAY_IMPORT[package] - {package}
        if bad:
            wrong[str(path.relative_to(REPO))] = sorted(bad)
    assert not wrong, f"{package} imports what it must not: {wrong}"


def test_no_module_reaches_into_the_tests_by_path():
    """sys.path tricks bypass the import check above: no package names the tests folder in its code."""
    for package in MAY_IMPORT:
        for path in (REPO / package).rglob("*.py"):
            assert not re.search(r"""/\s*["']tests["']|["']tests/""", path.read_text()), f"{path} names the tests folder"
