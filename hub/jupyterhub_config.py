"""JupyterHub configuration of the class hub (copied with the ``hub`` package to ``<root>/hub/lib`` by ``hub up``).

Everything site-specific comes from ``<root>/hub/settings.json`` (see hub/settings.py). Design, in short:

* login: PAM, i.e. the Unix accounts of the class (hub/classlist.py); only members of the course's two groups;
* spawner: hub/spawner.py — each server as its Unix user, students in the student environment, instructors in
  the instructor environment, per-user cgroup limits;
* one subdomain per user (``<user>.<domain>``): the only secure way to let formgrader open inside an
  instructor's JupyterLab with JupyterHub >= 4.1 (see docs/teaching-a-class.md, nbgrader issue #1870);
* the proxy: configurable-http-proxy from npm, installed under the environments folder, started by the hub.
"""
import sys
from pathlib import Path

LIB = Path(__file__).resolve().parent
sys.path.insert(0, str(LIB))

from hub.settings import COURSE_ID, HubSettings  # noqa: E402
from hub.spawner import CourseSpawner  # noqa: E402

c = get_config()  # noqa: F821  (provided by traitlets when it loads this file)
settings = HubSettings.load(LIB.parent / "settings.json")
state = settings.state

# ---- where the hub is reached ------------------------------------------------------------------
c.JupyterHub.bind_url = f"http://{settings.ip}:{settings.port}"
c.JupyterHub.subdomain_host = settings.url                       # users' servers on <user>.<domain>
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{settings.hub_port}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{settings.api_port}"
c.ConfigurableHTTPProxy.command = [str(settings.proxy_command)]
c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")

# ---- the hub's own state (root only) ------------------------------------------------------------
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True     # stopping the hub stops the servers; work is on disk, nothing is lost
c.JupyterHub.template_vars = {"announcement_login": f"Training at Scale ({COURSE_ID}): log in with your course account."}

# ---- who may log in ------------------------------------------------------------------------------
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.allowed_groups = {settings.instructors_group, settings.students_group}
c.PAMAuthenticator.open_sessions = False  # no login sessions (utmp, systemd-logind) for web servers

# ---- each user's server ----------------------------------------------------------------------------
CourseSpawner.hub_settings = settings
c.JupyterHub.spawner_class = CourseSpawner
c.Spawner.default_url = "/lab"
c.Spawner.mem_limit = settings.mem_limit
c.Spawner.cpu_limit = settings.cpu_limit
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 120
