"""Plumbing for the class-hub tests: a real hub set up by ``python -m hub up`` with its own names, real Unix users,
commands run as those users, and Chromium logging in through the hub's login page.

Every name is unique to the run (``th<hex>-alice``, groups ``th<hex>-…``, ``/srv/th<hex>-hub``, free ports), so a
demo hub on the same machine is never touched, and ``python -m hub down --purge`` removes all of it afterwards,
also when a test failed. ``assert_clean`` then checks that nothing is left: users, groups, processes, ports, files.
"""
import csv
import grp
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from browser_helpers import ARTIFACTS, CHROMIUM_ARGS, chromium_executable, free_port  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
HUB_ARTIFACTS = ARTIFACTS.parent / "hub"
STUDENTS = ("alice", "bob", "carol", "dave", "erin")  # alice: reference, bob: wrong, the rest: bad input


def hub_or_skip() -> None:
    """Skip with the reason when this machine cannot run the class hub (no root, no useradd, no system Python…)."""
    sys.path.insert(0, str(REPO))
    from hub.deploy import missing_requirements

    problems = missing_requirements()
    if problems:
        pytest.skip("class-hub tests skipped: this machine cannot create users and run a hub: " + "; ".join(problems))


@dataclass
class ClassHub:
    tag: str                                   # unique prefix of every name this hub uses
    env: dict                                  # TAS_HUB_* settings
    passwords: dict = field(default_factory=dict)
    up_seconds: float = 0.0

    @property
    def settings(self):
        from hub.settings import HubSettings

        return HubSettings.from_env(self.env)

    def user(self, short: str) -> str:
        return f"{self.tag}-{short}"

    @property
    def instructor(self) -> str:
        return self.user("teacher")

    def hub_command(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "hub", *args], cwd=REPO, env={**os.environ, **self.env},
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"python -m hub {' '.join(args)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        return done

    def as_user(self, user: str, *command: str, cwd: Path | None = None, check: bool = True,
                timeout: float = 600, **extra_env: str) -> subprocess.CompletedProcess:
        """``command`` as the Unix user ``user``, with the environment their server gives their terminals."""
        info = pwd.getpwnam(user)
        role = "instructor" if grp.getgrnam(self.settings.instructors_group).gr_gid in \
            os.getgrouplist(user, info.pw_gid) else "student"
        env_bin = self.settings.env(role) / "bin"
        env = {"HOME": info.pw_dir, "USER": user, "LOGNAME": user, "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
               "PATH": f"{env_bin}:/usr/bin:/bin", "JUPYTER_CONFIG_PATH": str(self.settings.jupyter_config(role)),
               "NBGRADER_EXCHANGE": str(self.settings.exchange), **extra_env}
        umask = "007" if role == "instructor" else "077"
        done = subprocess.run(["setpriv", f"--reuid={info.pw_uid}", f"--regid={info.pw_gid}", "--init-groups",
                               "sh", "-c", f'umask {umask} && exec "$@"', "sh", *command],
                              cwd=cwd or info.pw_dir, env=env, capture_output=True, text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"{user}$ {' '.join(command)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    def can_read(self, user: str, path: Path) -> bool:
        """Whether ``user`` can open the file or list the folder ``path`` (asked as that user, not guessed)."""
        probe = "import os,sys; p=sys.argv[1]; (os.listdir(p) if os.path.isdir(p) else open(p,'rb').read(1))"
        return self.as_user(user, "/usr/bin/python3", "-c", probe, str(path), check=False).returncode == 0


def start_class_hub(tmp: Path) -> ClassHub:
    """``python -m hub up`` with a class list of one instructor and the STUDENTS, all names unique to this run."""
    tag = f"th{secrets.token_hex(2)}"
    env = {"TAS_HUB_ROOT": f"/srv/{tag}-hub", "TAS_HUB_ENVS": f"/opt/{tag}-hub", "TAS_HUB_GROUP_PREFIX": tag,
           "TAS_HUB_PORT": str(free_port()), "TAS_HUB_HUB_PORT": str(free_port()),
           "TAS_HUB_API_PORT": str(free_port()), "TAS_HUB_MEM_LIMIT": "3G", "TAS_HUB_CPU_LIMIT": "1",
           # this suite's torch and triton, linked into the hub's envs: pip installs everything else (installing
           # torch for real is the installed_kit fixture's test)
           "TAS_HUB_SEED_SITE": sysconfig.get_paths()["purelib"]}
    hub = ClassHub(tag, env)
    class_list = tmp / "class.csv"
    rows = [["username", "role", "name"], [hub.instructor, "instructor", "Test Teacher"]]
    rows += [[hub.user(s), "student", s.title()] for s in STUDENTS]
    with open(class_list, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    import time

    start = time.monotonic()
    try:
        hub.hub_command("up", "--class-list", str(class_list), timeout=1800)
    except BaseException:
        stop_class_hub(hub)
        raise
    hub.up_seconds = time.monotonic() - start
    with open(hub.settings.state / "passwords.csv") as f:
        hub.passwords = {r["username"]: r["password"] for r in csv.DictReader(f)}
    return hub


def stop_class_hub(hub: ClassHub) -> None:
    subprocess.run([sys.executable, "-m", "hub", "down", "--purge"], cwd=REPO, env={**os.environ, **hub.env},
                   capture_output=True, text=True, timeout=600)


def leftovers(hub: ClassHub) -> list[str]:
    """What ``down --purge`` should have removed and did not."""
    from hub.classlist import group_exists, user_exists

    found = [f"user {u}" for u in [hub.instructor, *map(hub.user, STUDENTS)] if user_exists(u)]
    found += [f"group {g}" for g in (hub.settings.instructors_group, hub.settings.students_group) if group_exists(g)]
    found += [f"folder {p}" for p in (Path(hub.settings.root), Path(hub.settings.envs)) if p.exists()]
    for port in (hub.settings.port, hub.settings.hub_port, hub.settings.api_port):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                found.append(f"port {port} still answers")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if hub.tag in cmdline:
            found.append(f"process {pid}: {cmdline[:120]}")
    cgroups = [p for p in Path("/sys/fs/cgroup").glob(f"*/jupyterhub-{hub.tag}") if p.exists()]
    found += [f"cgroup {p}" for p in cgroups]
    return found


def login(browser, hub: ClassHub, user: str, viewport=None):
    """A fresh browser context, logged in through the hub's login page; returns the page on the user's JupyterLab."""
    context = browser.new_context(viewport=viewport or {"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{hub.settings.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", hub.passwords[user])
    page.click("#login_submit")
    page.wait_for_url(f"**{user}.{hub.settings.domain}*/user/{user}/lab**", timeout=180_000)
    page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)  # Lab is up (it may restore earlier tabs)
    return page


def dismiss_notifications(page) -> None:
    """Lab asks about news on first start; answer it so it does not cover the page."""
    button = page.locator(".jp-Notification-Toast-Close, .Toastify__close-button")
    for i in range(button.count()):
        button.nth(i).click()


def released_notebook(hub: ClassHub) -> dict:
    path = hub.settings.course / "notebooks" / "lesson1" / "01_gradient_accumulation.ipynb"
    return json.loads(path.read_text())


def write_as(hub: ClassHub, user: str, path: Path, text: str) -> None:
    """Write a file as ``user`` (so it is theirs, with their umask), through a pipe into their own process."""
    done = subprocess.run(["setpriv", f"--reuid={pwd.getpwnam(user).pw_uid}", f"--regid={pwd.getpwnam(user).pw_gid}",
                           "--init-groups", "sh", "-c", 'umask 077 && cat > "$1"', "sh", str(path)],
                          input=text, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def artifacts(name: str) -> Path:
    folder = HUB_ARTIFACTS / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder
