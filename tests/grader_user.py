"""Run `python -m autograder grade` as root or as an ordinary Unix user, the two ways instructors run it.

As root the tests create the user ``agtest`` (a system account without a home). The course's venv
interpreter may live somewhere only root can read (here: root's pyenv under /root, mode 0700), so the
user runs Debian's own python3 of the same version in a small venv whose ``.pth`` file adds this venv's
site-packages: the same pinned torch, nbgrader and grader code, no copy, no download.

``delegate=True`` gives the user a cgroup v1 subtree (cpu, memory, pids) chowned to it and starts the
grader inside it, as an admin delegates a subtree (systemd's ``Delegate=yes`` does the same on cgroup v2).
"""
import atexit
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USER = "agtest"
CGROUP_V1 = Path("/sys/fs/cgroup")


def is_root() -> bool:
    return os.geteuid() == 0


def ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        pass
    if not is_root() or not shutil.which("useradd"):
        pytest.skip(f"needs root (or an existing user {USER}) to grade as an ordinary user")
    subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                    "--shell", "/usr/sbin/nologin", USER], check=True, capture_output=True)
    return pwd.getpwnam(USER)


def _as_user(user: pwd.struct_passwd) -> list[str]:
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]


def _imports(python: str, user: pwd.struct_passwd) -> bool:
    probe = subprocess.run(_as_user(user) + ["env", "-i", "PATH=/usr/bin:/bin", "HOME=/tmp", python, "-c",
                                            "import torch, nbgrader, autograder.grader.sandbox.worker"],
                           capture_output=True, cwd="/", timeout=300)
    return probe.returncode == 0


@cache
def user_python(user: pwd.struct_passwd) -> str:
    """An interpreter the user can run that imports this course's packages; skip with the reason if none.
    Made once per test process and shared by its batches: the venv and its import probes cost seconds each time."""
    if _imports(sys.executable, user):
        return sys.executable
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    system_python = shutil.which(f"python{version}", path="/usr/bin:/bin")
    if not system_python:
        pytest.skip(f"{sys.executable} is unreadable for other users and there is no /usr/bin/python{version}")
    folder = shared_folder("user-python-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    venv = folder / "user-venv"
    subprocess.run([system_python, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    site_packages = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in site_packages)
    (venv / "lib" / f"python{version}" / "site-packages" / "course-venv.pth").write_text(lines)
    alembic = venv / "bin" / "alembic"  # nbgrader runs `alembic` from PATH to set up a gradebook
    alembic.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom alembic.config import main\nsys.exit(main())\n")
    subprocess.run(["chmod", "-R", "a+rX", str(venv)], check=True)
    alembic.chmod(0o755)
    python = str(venv / "bin" / "python")
    if not _imports(python, user):
        pytest.skip(f"user {USER} cannot read the course or its venv ({site_packages}); clone it somewhere readable")
    return python


@contextmanager
def delegated_cgroups(user: pwd.struct_passwd):
    """cpu, memory and pids groups owned by ``user``; yields the cgroup.procs files to join."""
    name = f"autograder-test-delegated-{os.getpid()}"
    groups = [CGROUP_V1 / c / name for c in ("cpu", "memory", "pids")]
    if not is_root() or not all(g.parent.is_dir() for g in groups):
        pytest.skip("delegating cgroups needs root and cgroup v1 (cpu, memory, pids)")
    for group in groups:
        group.mkdir()
        os.chown(group, user.pw_uid, user.pw_gid)
        os.chown(group / "cgroup.procs", user.pw_uid, user.pw_gid)
    try:
        yield [g / "cgroup.procs" for g in groups]
    finally:
        for _ in range(200):  # whatever is left in them (nothing should be) is killed, then they go
            pids = {int(p) for g in groups for p in (g / "cgroup.procs").read_text().split()}
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not pids:
                break
            time.sleep(0.02)
        for group in groups:
            for child in sorted(group.glob("autograder-*"), reverse=True):
                child.rmdir()
            group.rmdir()


def shared_folder(prefix: str) -> Path:
    """A folder both root and the test user can use (pytest's own tmp folders are private to root)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    folder.chmod(0o755)
    return folder


def give_to(user: pwd.struct_passwd, *paths: Path) -> None:
    """chown -R without following a link (a submitted link to solutions/ must not hand over its target)."""
    for top in paths:
        os.lchown(top, user.pw_uid, user.pw_gid)
        for folder, dirs, files in os.walk(top):
            for name in dirs + files:
                os.lchown(os.path.join(folder, name), user.pw_uid, user.pw_gid)


def grade(submissions: Path, out: Path, *extra: str, as_user: bool, env: dict | None = None,
          delegate: bool = False, timeout: float = 1500) -> subprocess.CompletedProcess:
    """`python -m autograder grade` as root (this interpreter) or as the ordinary user."""
    env = {**os.environ, **(env or {})}
    if not as_user:
        command = [sys.executable, "-m", "autograder", "grade", str(submissions), "--out", str(out), "--quiet", *extra]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    user = ensure_user()
    work = out.parent
    python = user_python(user)
    give_to(user, submissions, work)
    keep = {k: v for k, v in env.items() if k.startswith(("NBGRADER_", "SECRET_", "AUTOGRADER_TEST"))}
    user_env = ["env", "-i", f"PATH={Path(python).parent}:/usr/bin:/bin", f"HOME={work}", "LANG=C.UTF-8",
                *(f"{k}={v}" for k, v in keep.items())]
    command = _as_user(user) + user_env + [python, "-m", "autograder", "grade", str(submissions), "--out", str(out),
                                           "--quiet", *extra]
    if not delegate:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=work)
    with delegated_cgroups(user) as procs:
        def join():
            for path in procs:
                with open(path, "w") as f:
                    f.write(str(os.getpid()))
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=work, preexec_fn=join)
