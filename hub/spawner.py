"""The spawner of the class hub: each user's JupyterLab as that Unix user, in the environment of their role.

* students: the student environment (the student kit: lessons, self-checks, no solutions), working in their home;
  Jupyter config with nbgrader's exchange and the Assignment List (formgrader and Create Assignment are off in
  that environment); their first page says where the course is and how to fetch it (``hub.welcome``);
* instructors: the instructor environment (the course repository installed), working in the course folder that
  only the instructors' group can read, with formgrader;
* both: umask that keeps files private (students) or shared with the instructors' group only (instructors), and
  the CPU/memory limits of ``hub.limits`` joined before the process drops to the user's uid.

A user is an instructor when they are in the instructors' Unix group, a student when in the students' group.
"""
import grp
import os
import pwd

from jupyterhub.spawner import LocalProcessSpawner

from hub.limits import UserCgroups
from hub.settings import HubSettings
from hub.welcome import STUDENT_FIRST_PAGE, write_welcome


def role_of(username: str, settings: HubSettings) -> str | None:
    user = pwd.getpwnam(username)
    gids = set(os.getgrouplist(username, user.pw_gid))
    for role, group in (("instructor", settings.instructors_group), ("student", settings.students_group)):
        try:
            if grp.getgrnam(group).gr_gid in gids:
                return role
        except KeyError:
            continue
    return None


class CourseSpawner(LocalProcessSpawner):
    hub_settings: HubSettings = None  # set by jupyterhub_config.py
    _cgroups_warned = False

    @property
    def cgroups(self) -> UserCgroups:
        return UserCgroups(f"jupyterhub-{self.hub_settings.group_prefix}")

    async def start(self):
        settings = self.hub_settings
        role = role_of(self.user.name, settings)
        if role is None:
            raise RuntimeError(f"{self.user.name} is in neither {settings.instructors_group} nor {settings.students_group}")
        env = settings.env(role)
        self.cmd = [str(env / "bin" / "jupyterhub-singleuser")]
        self.notebook_dir = str(settings.course) if role == "instructor" else "~"
        self.role = role
        if role == "student":  # not an empty Launcher: the page that says where the lessons come from
            self.default_url = STUDENT_FIRST_PAGE
        self.environment = {
            **self.environment,
            "PATH": f"{env / 'bin'}:/usr/local/bin:/usr/bin:/bin",  # nbgrader runs `alembic` from PATH
            "JUPYTER_CONFIG_PATH": str(settings.jupyter_config(role)),
            "COURSE_ROLE": role,
        }
        self.umask = 0o007 if role == "instructor" else 0o077
        self.group = self._prepare_limits()
        return await super().start()

    def _prepare_limits(self):
        try:  # mem_limit is JupyterHub's ByteSpecification: "4G" in the config, bytes here
            return self.cgroups.prepare(self.user.name, self.mem_limit or None, self.cpu_limit)
        except OSError as exc:
            if not CourseSpawner._cgroups_warned:
                self.log.warning("per-user CPU/memory limits are NOT enforced: cannot create cgroups (%s)", exc)
                CourseSpawner._cgroups_warned = True
            return None

    def make_preexec_fn(self, name):
        drop_privileges = super().make_preexec_fn(name)
        group, umask = self.group, self.umask
        welcome_home = pwd.getpwnam(name).pw_dir if getattr(self, "role", None) == "student" else None

        def preexec():
            if group:
                group.join()  # as root, before setuid: the user cannot leave the cgroup afterwards
            os.umask(umask)
            drop_privileges()
            if welcome_home:
                write_welcome(welcome_home)  # as the student: their file, in their home, never over one of theirs

        return preexec

    async def stop(self, now=False):
        await super().stop(now=now)
        self.cgroups.remove(self.user.name)
