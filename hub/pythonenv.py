"""Python environments that other Unix users can run: built from the system's Python, readable by everyone.

Why not the interpreter that runs this code: on many machines (this project's included) the default Python
lives in root's home (pyenv, 0700), so a virtual environment made from it starts for root and fails with
"Permission denied" for every other uid. An environment for students' or instructors' servers (or for any
unprivileged worker) is therefore made from the system's Python (Debian: ``/usr/bin/python3.11`` with
``python3-venv``), and every file in it is made readable by the users who run it.

    build_env(Path("/opt/x/student-env"), ["./kit.whl", "jupyterhub==6.1.1"])

An environment is rebuilt only when what was asked for changes (a stamp file records it), so calling this
again is cheap. ``seed`` (a site-packages of the same Python version) hard-links torch and triton, with what they
require, into a new environment before pip runs: pip finds them installed and skips their ~1.4 GB (the tests' hubs
reuse the test suite's own; every other package is still installed by pip from the requirements).
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

SYSTEM_PYTHONS = ("/usr/bin/python3.11", "/usr/local/bin/python3.11", "/usr/bin/python3")
STAMP = ".built-from"
# pip settings that must survive the clean environment we run pip in (mirrors, local wheel folders, caps)
PIP_SETTINGS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_CERT",
                "PIP_CONFIG_FILE", "PIP_DEFAULT_TIMEOUT", "PIP_CACHE_DIR", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY")


class EnvBuildError(RuntimeError):
    """An environment could not be built; the message says what to install or fix."""


def system_python() -> str:
    """A Python 3.11+ that every user can execute, with a working ``venv`` module."""
    for candidate in SYSTEM_PYTHONS:
        if os.access(candidate, os.X_OK) and _world_usable(Path(candidate)):
            done = subprocess.run([candidate, "-c", "import sys, venv, ensurepip; print(sys.version_info >= (3, 11))"],
                                  capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip() == "True":
                return candidate
    raise EnvBuildError(
        "no system Python 3.11 with venv that other users can run: install it (Debian/Ubuntu: "
        "`apt-get install python3.11 python3.11-venv`). The Python in root's home cannot be used for other users.")


def _world_usable(path: Path) -> bool:
    """Every folder on the way is searchable and the file is executable by any user."""
    real = path.resolve()
    parts = [real, *real.parents]
    return all(p.stat().st_mode & 0o001 for p in parts if p != real) and bool(real.stat().st_mode & 0o005)


def _fingerprint(requirements: list[str]) -> str:
    """What the environment was built from: the requirement strings and the bytes of any local file among them."""
    digest = hashlib.sha256()
    for req in requirements:
        digest.update(req.encode() + b"\0")
        path = Path(req.removeprefix("-e ").strip())
        if path.is_file():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def build_env(path: Path, requirements: list[str], *, python: str | None = None, seed: Path | None = None,
              log=print) -> bool:
    """Create (or keep) a virtual environment at ``path`` with ``requirements`` installed; returns True when built.

    A requirement may be ``-e FOLDER`` for an editable install. Everything under ``path`` is made world-readable
    (narrow it afterwards with ``restrict``)."""
    path = Path(path)
    fingerprint = _fingerprint(requirements)
    stamp = path / STAMP
    if stamp.is_file() and stamp.read_text() == fingerprint and (path / "bin" / "python").exists():
        log(f"  {path}: up to date")
        return False
    python = python or system_python()
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(path.parent), "LANG": "C.UTF-8",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1",
           **{k: v for k, v in os.environ.items() if k in PIP_SETTINGS}}
    _run([python, "-m", "venv", str(path)], env)
    if seed:
        link_installed(Path(seed), path, SEEDED)
    args = []
    for req in requirements:
        args += ["-e", req[3:].strip()] if req.startswith("-e ") else [req]
    _run([str(path / "bin" / "python"), "-m", "pip", "install", "--quiet", *args], env)
    make_readable(path)
    stamp.write_text(fingerprint)
    return True


def _run(command: list[str], env: dict) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        noise = "is ignored: it is neither a file nor a directory"  # harmless warnings of local index mirrors
        output = "\n".join(line for line in (done.stdout + done.stderr).splitlines() if noise not in line)
        raise EnvBuildError(f"{' '.join(command[:4])} … failed ({done.returncode}):\n{output[-3000:]}")


SEEDED = ("torch", "triton")  # the two largest wheels of the course's requirements


def link_installed(site: Path, env: Path, names: tuple[str, ...]) -> None:
    """The distributions ``names`` installed in ``site``, and every distribution they require, made installed in
    the virtual environment ``env`` too: their files hard-linked (copied across file systems), their scripts
    written to ``env``/bin for its own interpreter. Links, not a .pth naming ``site``: pip in ``env`` may upgrade
    or remove what it finds, and an unlink never touches the originals."""
    from importlib.metadata import distributions

    from packaging.requirements import Requirement

    (target,) = env.glob("lib/python*/site-packages")
    if target.parent.name != site.parent.name:
        raise EnvBuildError(f"{site} is not for {target.parent.name}: it cannot seed {env}")
    installed = {_normal(d.metadata["Name"]): d for d in distributions(path=[str(site)])}
    todo, done = [_normal(n) for n in names], set()
    while todo:
        name = todo.pop()
        if name in done or name not in installed or name in ("pip", "setuptools"):  # the venv has its own
            continue
        done.add(name)
        dist = installed[name]
        for file in dist.files or ():
            source = Path(dist.locate_file(file))
            if file.parts[0] != "..":
                _link(source, target / file)
            elif file.parts[-2] == "bin" and source.is_file():  # a console script: its #! names site's interpreter
                script = env / "bin" / file.name
                lines = source.read_bytes().split(b"\n", 1)
                if lines[0].startswith(b"#!"):
                    lines[0] = f"#!{env / 'bin' / 'python'}".encode()
                script.write_bytes(b"\n".join(lines))
                script.chmod(0o755)
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_normal(req.name))


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _link(source: Path, target: Path) -> None:
    if target.exists() or not source.is_file():  # a file RECORD lists that is not there
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:  # another file system
        shutil.copy2(source, target)


def make_readable(path: Path) -> None:
    """Files readable, folders and programs searchable/executable, by every user (u+rwX kept, go+rX added)."""
    for folder, _dirs, files in os.walk(path):
        os.chmod(folder, os.stat(folder).st_mode | 0o755)
        for name in files:
            full = os.path.join(folder, name)
            if not os.path.islink(full):
                mode = os.stat(full).st_mode
                os.chmod(full, mode | 0o644 | (0o111 if mode & 0o100 else 0))


def restrict(path: Path, group: str) -> None:
    """Only root and ``group`` may enter ``path`` (the files inside keep their modes)."""
    shutil.chown(path, group=group)
    os.chmod(path, 0o750)


if __name__ == "__main__":  # python -m hub.pythonenv DEST REQUIREMENT...
    build_env(Path(sys.argv[1]), sys.argv[2:])
