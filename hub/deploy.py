"""Set up, start, stop and remove the one-server class hub (``python -m hub up|start|stop|down``; ``make hub``).

    <root>  (/srv/training-at-scale, 0755)
      course/      the instructors' copy of the course repository: solutions, nbgrader's course folder with
                   gradebook.db, submitted/, autograded/, feedback/          root:<instructors> 2770, others: none
      exchange/    nbgrader's exchange, shared by everyone (nbgrader sets the modes of what it creates)   1777
      config/student, config/instructor   the Jupyter settings each role's servers read (JUPYTER_CONFIG_PATH)
      hub/         the hub's database, cookie secret, logs, settings, class accounts and passwords     root 0700
    <envs>  (/opt/training-at-scale)
      student-env/     the student kit + JupyterHub's single-user server                     everyone can read
      instructor-env/  the course copy installed (editable) + JupyterHub's single-user server   root:<instructors> 0750
      hub-env/         JupyterHub itself;  proxy/  configurable-http-proxy from npm;  kit/  the built student kit
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hub.classlist import Accounts, kill_processes_of, parse_class_list
from hub.limits import UserCgroups
from hub.pythonenv import build_env, make_readable, restrict
from hub.settings import COURSE_ID, PINNED, HubSettings
from hub.welcome import STUDENT_LAB_OVERRIDES

REPO = Path(__file__).resolve().parent.parent
HUB_PACKAGE = Path(__file__).resolve().parent
JUPYTERHUB = f"jupyterhub=={PINNED['jupyterhub']}"
LAB_OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False}}


def lab_overrides(role: str) -> dict:
    """The JupyterLab settings of a role's environment (students': their welcome page opens rendered)."""
    return {**LAB_OVERRIDES, **(STUDENT_LAB_OVERRIDES if role == "student" else {})}


class SetupError(RuntimeError):
    """Something the machine lacks; the message says what to do."""


# ---- checks ----------------------------------------------------------------------------------------

def missing_requirements() -> list[str]:
    """What this machine lacks to run the class hub (empty when it can)."""
    problems = []
    if sys.platform != "linux":
        problems.append("the class hub runs on Linux (it creates Unix users and uses PAM)")
    elif os.geteuid() != 0:
        problems.append("run as root: the hub creates Unix users and starts each user's server as that user")
    for tool in ("useradd", "userdel", "groupadd", "chpasswd", "npm", "node"):
        if not shutil.which(tool, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"):
            package = "nodejs npm" if tool in ("npm", "node") else "passwd"
            problems.append(f"`{tool}` is missing (Debian: apt-get install {package})")
    try:
        from hub.pythonenv import system_python
        system_python()
    except RuntimeError as exc:
        problems.append(str(exc))
    return problems


def readable_by_others(path: Path) -> bool:
    """Whether a user who is neither owner nor in the group can list ``path`` (every folder above searchable)."""
    path = path.resolve()
    above = all(p.stat().st_mode & 0o001 for p in path.parents)
    return above and (path.stat().st_mode & 0o005) == 0o005


# ---- building ----------------------------------------------------------------------------------------

def _copy_course(settings: HubSettings, repo: Path, log) -> None:
    """The instructors' copy of the repository (tracked and new files; no venv, no build output)."""
    if settings.course.exists():
        log(f"  {settings.course}: kept (the term's state lives there; copy updated solutions in by hand or with git)")
        return
    if (repo / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                                capture_output=True, check=True).stdout.decode().split("\0")
        files = [f for f in listed if f and (repo / f).is_file()]
    else:
        skip = {".venv", ".git", "dist", "build", "test-artifacts", "__pycache__", ".pytest_cache", ".ruff_cache"}
        files = [str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file() and not skip & set(p.parts)]
    for rel in files:
        dest = settings.course / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, dest)
    log(f"  {settings.course}: {len(files)} files of the course repository")


def _share_with_group(folder: Path, group: str) -> None:
    """root:<group>, folders 2770 (new files inherit the group), files group-writable, nothing for others."""
    for current, _dirs, files in os.walk(folder):
        shutil.chown(current, "root", group)
        os.chmod(current, 0o2770)
        for name in files:
            path = os.path.join(current, name)
            if not os.path.islink(path):
                shutil.chown(path, "root", group)
                os.chmod(path, (os.stat(path).st_mode & 0o770) | 0o660)


def _build_kit(settings: HubSettings, repo: Path, log) -> Path:
    done = subprocess.run([sys.executable, "-m", "autograder", "student-kit", "--out", str(settings.kit)], cwd=repo,
                          capture_output=True, text=True)
    if done.returncode:
        raise SetupError(f"building the student kit failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    (wheel,) = settings.kit.glob("*.whl")
    for stray in settings.kit.parent.glob("training-at-scale-student-*.zip"):
        stray.unlink()  # the LMS zip the kit command writes next to its folder: not needed on the hub
    log(f"  {wheel}")
    return wheel


def _build_envs(settings: HubSettings, wheel: Path, log) -> None:
    jobs = {"student": [str(wheel), JUPYTERHUB], "instructor": [f"-e {settings.course}", JUPYTERHUB],
            "hub": [JUPYTERHUB]}
    with ThreadPoolExecutor(len(jobs)) as pool:
        seed = {"student": settings.seed_site, "instructor": settings.seed_site}  # the hub's own env has no torch
        futures = {name: pool.submit(build_env, settings.env(name), reqs, seed=seed.get(name) or None, log=log)
                   for name, reqs in jobs.items()}
        for name, future in futures.items():
            if future.result():
                log(f"  {settings.env(name)}: built")
    for role in ("student", "instructor"):  # no news or update pop-ups: they would fetch from the internet
        overrides = settings.env(role) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
        overrides.parent.mkdir(parents=True, exist_ok=True)
        overrides.write_text(json.dumps(lab_overrides(role), indent=1))
        make_readable(overrides.parent)
    restrict(settings.env("instructor"), settings.instructors_group)


def _install_proxy(settings: HubSettings, log) -> None:
    folder = Path(settings.envs) / "proxy"
    lock = (HUB_PACKAGE / "proxy" / "package-lock.json").read_bytes()
    if settings.proxy_command.exists() and (folder / "package-lock.json").read_bytes() == lock:
        log(f"  {settings.proxy_command}: up to date")
        return
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(HUB_PACKAGE / "proxy" / name, folder / name)
    done = subprocess.run(["npm", "ci", "--omit=dev", "--no-audit", "--no-fund", "--loglevel=error"], cwd=folder,
                          capture_output=True, text=True)
    if done.returncode or not settings.proxy_command.exists():
        raise SetupError(f"npm could not install configurable-http-proxy:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    make_readable(folder)
    log(f"  {settings.proxy_command}")


def _write_jupyter_config(settings: HubSettings) -> None:
    student, instructor = settings.jupyter_config("student"), settings.jupyter_config("instructor")
    student.mkdir(parents=True, exist_ok=True)
    instructor.mkdir(parents=True, exist_ok=True)
    (student / "nbgrader_config.py").write_text(
        "# Students' servers: the course's exchange (written by `python -m hub up`)\n"
        "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
        f"c.Exchange.root = {str(settings.exchange)!r}\n")
    (instructor / "nbgrader_config.py").write_text(
        "# Instructors' servers: the course's own nbgrader config, on the hub's exchange (written by `python -m hub up`)\n"
        "c = get_config()  # noqa: F821\n"
        f"load_subconfig('nbgrader_config.py', path={str(settings.nbgrader_course)!r})  # noqa: F821\n"
        f"c.Exchange.root = {str(settings.exchange)!r}\n"
        "c.CourseDirectory.groupshared = True  # every instructor can collect, grade and release\n"
        "import sys  # noqa: E402\n"
        f"sys.path.insert(0, {str(instructor)!r})\n"
        "c.ExchangeFactory.collect = 'owner_collect.OwnerCheckedCollect'  # a submission counts for its owner only\n")
    shutil.copyfile(HUB_PACKAGE / "owner_collect.py", instructor / "owner_collect.py")
    (instructor / "jupyter_server_config.py").write_text(
        "# Formgrader opens inside JupyterLab in an iframe of the instructor's own server. JupyterHub >= 4.1 forbids\n"
        "# every iframe (frame-ancestors 'none') because, on one shared origin, another user's page could frame this\n"
        "# server. The hub gives each user their own subdomain (JupyterHub.subdomain_host), so 'self' is this user's\n"
        "# own origin only: the nbgrader documentation's secure setting (nbgrader issue #1870, PR #1947).\n"
        "c = get_config()  # noqa: F821\n"
        "c.ServerApp.tornado_settings = {'headers': {'Content-Security-Policy': \"frame-ancestors 'self'\"}}\n")
    make_readable(student.parent)
    shutil.chown(instructor, "root", settings.instructors_group)
    os.chmod(instructor, 0o750)


# What of the grader the hub's own process imports (hub/limits.py): the package chain down to its cgroup manager.
GRADER_MODULES = ("autograder/__init__.py", "autograder/grader/__init__.py", "autograder/grader/sandbox/__init__.py",
                  "autograder/grader/sandbox/cgroups.py")


def _install_hub_files(settings: HubSettings) -> None:
    lib = settings.state / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    (lib / "hub").mkdir(parents=True)
    for module in HUB_PACKAGE.glob("*.py"):
        shutil.copyfile(module, lib / "hub" / module.name)
    for module in GRADER_MODULES:  # the one cgroup manager, shared with the class grader
        (lib / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / module, lib / module)
    shutil.copyfile(HUB_PACKAGE / "jupyterhub_config.py", lib / "jupyterhub_config.py")
    settings.save()


def up(settings: HubSettings, class_list: Path, repo: Path = REPO, log=print) -> None:
    """Everything for a class on this machine, then start the hub. Safe to run again: what exists is kept."""
    problems = missing_requirements()
    if problems:
        raise SetupError("this machine cannot run the class hub:\n  " + "\n  ".join(problems))
    start_time = time.monotonic()
    members, bad = parse_class_list(Path(class_list).read_text())
    for row in bad:
        log(f"class list {class_list}, {row}: skipped")
    if not members:
        raise SetupError(f"the class list {class_list} has no usable row")
    if not any(m.role == "instructor" for m in members) and not Accounts(
            settings.state, settings.instructors_group, settings.students_group).members():
        log("warning: the class list names no instructor")

    log(f"[1/6] folders under {settings.root} and {settings.envs}")
    for folder, mode in ((Path(settings.root), 0o755), (settings.state, 0o700), (Path(settings.envs), 0o755)):
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, mode)
    settings.exchange.mkdir(exist_ok=True)
    os.chmod(settings.exchange, 0o1777)  # nbgrader's exchange: everyone writes, nobody removes others' entries

    log("[2/6] accounts and groups")
    accounts = Accounts(settings.state, settings.instructors_group, settings.students_group)
    accounts.ensure_groups()
    for member in members:
        password = accounts.add(member)
        what = "new account" if password else "existing account, added to the course"
        log(f"  {member.role:10} {member.username:24} {what}")

    log("[3/6] the instructors' course folder and the student kit")
    _copy_course(settings, repo, log)
    wheel = _build_kit(settings, repo, log)

    log("[4/6] Python environments (student, instructor, hub) and the proxy")
    _build_envs(settings, wheel, log)
    _share_with_group(settings.course, settings.instructors_group)  # after the editable install wrote into it
    _install_proxy(settings, log)

    log("[5/6] configuration")
    _write_jupyter_config(settings)
    _install_hub_files(settings)
    if readable_by_others(repo / "solutions"):
        log(f"  WARNING: {repo / 'solutions'} is readable by every user on this machine, students included. "
            f"Run `chmod o-rwx {repo}` or keep the repository in a private folder; the hub uses its own copy.")

    log("[6/6] starting JupyterHub")
    start(settings, log)
    log(f"\nThe class hub is up in {time.monotonic() - start_time:.0f} s: {settings.url}/hub/login")
    if accounts.passwords.exists():
        log(f"Passwords of the accounts it created: {accounts.passwords} (root only):")
        log(accounts.passwords.read_text())
    log("Stop: python -m hub stop (keeps everything) · remove all: make hub-down · docs/teaching-a-class.md")


# ---- running -----------------------------------------------------------------------------------------

def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def hub_pid(settings: HubSettings) -> int | None:
    return _pid(settings.state / "jupyterhub.pid")


def _health(settings: HubSettings) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{settings.port}/hub/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def start(settings: HubSettings, log=print, timeout: float = 120) -> int:
    """Start JupyterHub (it starts the proxy) in the background; returns its pid once it answers."""
    running = hub_pid(settings)
    if running:
        log(f"  JupyterHub is already running (pid {running})")
        return running
    log_file = open(settings.state / "jupyterhub.log", "a")
    env = {"PATH": f"{settings.env('hub') / 'bin'}:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "HOME": str(settings.state)}
    process = subprocess.Popen([str(settings.env("hub") / "bin" / "jupyterhub"), "-f",
                                str(settings.state / "lib" / "jupyterhub_config.py")],
                               cwd=settings.state, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SetupError(f"JupyterHub exited ({process.returncode}); its log: {settings.state / 'jupyterhub.log'}\n"
                             + _tail(settings.state / "jupyterhub.log"))
        if _health(settings):
            log(f"  JupyterHub pid {process.pid}, log {settings.state / 'jupyterhub.log'}")
            return process.pid
        time.sleep(0.5)
    process.terminate()
    raise SetupError(f"JupyterHub did not answer within {timeout:.0f} s:\n" + _tail(settings.state / "jupyterhub.log"))


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def _stop_pid(pid: int | None, grace: float) -> None:
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop(settings: HubSettings, log=print) -> None:
    """Stop the hub, the proxy and every server of the class (files are untouched)."""
    if not settings.state.exists():
        return
    _stop_pid(hub_pid(settings), grace=60)  # the hub stops the users' servers and the proxy it started
    _stop_pid(_pid(settings.state / "proxy.pid"), grace=10)
    import pwd
    for username in Accounts(settings.state, settings.instructors_group, settings.students_group).members():
        try:
            kill_processes_of(pwd.getpwnam(username).pw_uid)  # a kernel or rank left behind by a server
        except KeyError:
            pass
    UserCgroups(f"jupyterhub-{settings.group_prefix}").remove()
    log("  stopped JupyterHub, the proxy and the class's servers")


def down(settings: HubSettings, purge: bool, log=print) -> None:
    """Stop; with ``purge`` also remove the accounts the hub created (homes included), its groups and all files."""
    stop(settings, log)
    if not purge:
        return
    if settings.state.exists():
        Accounts(settings.state, settings.instructors_group, settings.students_group).remove_all(log)
    for folder in (Path(settings.root), Path(settings.envs)):
        if folder.exists():
            shutil.rmtree(folder)
            log(f"  removed {folder}")
