"""Every command the README shows runs from the repository root in a fresh shell (issue 27).

The README never asks to activate `.venv`, so a command is runnable as written only if it is a `make` target (the
Makefile finds the venv) or names its program in `.venv/bin/`. A few run elsewhere on purpose (the student kit's
environment, a bare GPU machine's python3, the system's package manager, a hub server's terminal): each of those
must say so in its own paragraph.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
PROGRAMS = {"make", "python", "python3", "pip", "pip3", "nbgrader", "jupyter", "conda", "cd", "apt", "apt-get",
            "training-at-scale", "torchrun", "pytest", "ruff", "jupyterhub", "sudo", "source"}
# command prefix -> the words in its paragraph that say where it runs (not in this repository's .venv)
ELSEWHERE = {
    "apt install": "Debian's",
    "cd classroom && jupyter lab": "in the shell where the environment is activated",
    "pip install ./training_at_scale_student": "fresh virtual environment, activated",
    "training-at-scale lab": "where the kit's environment is activated",
    "python3 -m bench.gpu_evidence": "any `python3` that holds PyTorch",
    "python -m autograder grade submitted": "whose PATH holds the course's environment",
}


def _blocks(text: str) -> list[str]:
    """Paragraphs, list blocks, tables and fenced blocks (a fence stays one block, blank lines and all)."""
    blocks, current, fenced = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not line.strip() and not fenced:
            blocks.append("\n".join(current))
            current = []
        else:
            current.append(line)
    return [b for b in [*blocks, "\n".join(current)] if b]


def readme_commands() -> list[tuple[str, str]]:
    """(command, its paragraph and the one before) for every command in a code block, a table or inline code."""
    found, blocks = [], _blocks(README)
    for i, block in enumerate(blocks):
        context = "\n".join(blocks[max(0, i - 1): i + 1])
        if block.startswith("```"):
            candidates = [re.sub(r"\s+#.*$", "", line) for line in block.splitlines()[1:-1]]
        else:
            candidates = [m.replace("\n", " ") for m in re.findall(r"`([^`]+)`", block)]
        for text in candidates:
            words = re.sub(r"^(\w+=\S+\s+)+", "", text.strip()).split()
            if len(words) > 1 and (words[0] in PROGRAMS or words[0].startswith((".venv/", "../.venv/"))):
                found.append((text.strip(), context))
    return found


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.MULTILINE))


def problem(command: str, context: str) -> str | None:
    """Why ``command`` does not run as written in a fresh shell at the repository root, or None."""
    for prefix, words in ELSEWHERE.items():
        if re.sub(r"^(\w+=\S+\s+)+", "", command).startswith(prefix):
            said = words in " ".join(context.split())
            return None if said else f"runs outside .venv, and its paragraph does not say so ({words!r})"
    cwd, activated = REPO, False
    for part in (p.strip() for p in command.split("&&")):
        words = part.split()
        if activated:
            continue
        if words[:2] == ["conda", "activate"]:
            activated = True
        elif words[:3] == ["conda", "env", "create"]:
            continue
        elif words[0] == "cd":
            cwd = (cwd / words[1]).resolve()
            if not cwd.is_dir():
                return f"`{part}`: no such folder"
        elif words[0] == "make":
            if cwd != REPO or words[1] not in makefile_targets():
                return f"`{part}`: not a target of the repository's Makefile"
        elif (cwd / words[0]).parent.resolve() == (REPO / ".venv" / "bin").resolve():
            if words[1:3] and words[1] == "-m":
                module = REPO / words[2].replace(".", "/")
                if not (module.with_suffix(".py").is_file() or (module / "__main__.py").is_file()):
                    return f"`{part}`: no module {words[2]} in the repository"
        else:
            return f"`{part}`: needs an activated .venv (use a make target or .venv/bin/{words[0]})"
    return None


def test_the_readme_shows_commands():
    commands = [c for c, _ in readme_commands()]
    assert "make lab" in commands and any(c.startswith(".venv/bin/python -m autograder grade") for c in commands)
    assert any(c.startswith("make nbgrader") for c in commands), commands


def test_every_readme_command_runs_in_a_fresh_shell():
    problems = {c: why for c, context in readme_commands() if (why := problem(c, context))}
    assert not problems, "\n".join(f"{c}\n    {why}" for c, why in problems.items())


def test_the_check_tells_runnable_from_not():
    assert problem("python -m autograder grade S --out O", "") and problem("nbgrader collect lesson1", "")
    assert problem("cd autograder/course && nbgrader release_assignment lesson1", "")
    assert problem("make no-such-target", "") and problem(".venv/bin/python -m no_such_module", "")
    assert not problem('make nbgrader ARGS="collect lesson1"', "")
    assert not problem("conda activate x && cd classroom && jupyter lab", "")


def test_make_nbgrader_works_from_a_fresh_shell(tmp_path):
    """`make nbgrader ARGS=...` with a bare PATH: nbgrader runs, and makes a new gradebook with the venv's alembic."""
    if not shutil.which("make"):
        pytest.skip("no `make` on PATH")
    venv = os.path.relpath(sys.prefix, REPO)
    env = {"HOME": str(tmp_path), "PATH": "/usr/local/bin:/usr/bin:/bin", "NBGRADER_COURSE_ROOT": str(tmp_path),
           "JUPYTER_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run(["make", "-o", f"{venv}/.installed", "nbgrader", f"VENV={venv}", "ARGS=db student list"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "students in the database" in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "gradebook.db").is_file()
