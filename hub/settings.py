"""Where the class hub lives and how it is reached: one set of settings, read from TAS_HUB_* variables.

The same settings are written to ``<root>/hub/settings.json`` when the hub is set up; the JupyterHub
configuration and the spawner read that file, so every part agrees on paths, groups, ports and limits.
Why variables and not JupyterHub's own config file: they are needed before JupyterHub exists (``python -m hub up``
creates the accounts, the environments and that very config), by the same command that tears it down.
"""
import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

COURSE_ID = "training-at-scale"  # nbgrader's course id (classroom/nbgrader_config.py)
PINNED = {"jupyterhub": "6.1.1"}  # the hub and every user's server run this JupyterHub


@dataclass(frozen=True)
class HubSettings:
    root: str = "/srv/training-at-scale"      # course copy, exchange, the hub's own state, Jupyter config
    envs: str = "/opt/training-at-scale"      # Python environments, the proxy, the built student kit
    ip: str = "127.0.0.1"                     # where the hub listens; 0.0.0.0 on a server behind HTTPS
    port: int = 8000                          # the address people open: http://<domain>:<port>
    domain: str = "localhost"                 # users' servers live on <user>.<domain> (needs wildcard DNS)
    hub_port: int = 8081                      # the hub's own API, loopback only
    api_port: int = 8001                      # the proxy's API, loopback only
    group_prefix: str = "tas"                 # Unix groups <prefix>-instructors and <prefix>-students
    mem_limit: str = "4G"                     # per user server, kernels and ranks included
    cpu_limit: float = 1.0                    # CPUs per user server
    seed_site: str = ""                       # a Python 3.11 site-packages holding torch==2.13.0: linked, not
                                              # installed again, into the student and instructor envs (the tests)

    # ---- derived paths -------------------------------------------------------------------------
    @property
    def course(self) -> Path:
        """The instructors' copy of the course repository (solutions, gradebook): instructors' group only."""
        return Path(self.root) / "course"

    @property
    def nbgrader_course(self) -> Path:
        """nbgrader's course directory inside it (gradebook.db, submitted/, autograded/, feedback/)."""
        return self.course / "classroom"

    @property
    def exchange(self) -> Path:
        return Path(self.root) / "exchange"

    @property
    def state(self) -> Path:
        """The hub's own files (database, cookie secret, logs, passwords): root only."""
        return Path(self.root) / "hub"

    def jupyter_config(self, role: str) -> Path:
        """The Jupyter configuration folder a server of ``role`` reads (JUPYTER_CONFIG_PATH)."""
        return Path(self.root) / "config" / role

    def env(self, name: str) -> Path:
        """``student``, ``instructor`` or ``hub``: a virtual environment under ``envs``."""
        return Path(self.envs) / f"{name}-env"

    @property
    def proxy_command(self) -> Path:
        return Path(self.envs) / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"

    @property
    def kit(self) -> Path:
        return Path(self.envs) / "kit"

    @property
    def instructors_group(self) -> str:
        return f"{self.group_prefix}-instructors"

    @property
    def students_group(self) -> str:
        return f"{self.group_prefix}-students"

    @property
    def url(self) -> str:
        return f"http://{self.domain}:{self.port}"

    def user_url(self, user: str) -> str:
        return f"http://{user}.{self.domain}:{self.port}/user/{user}"

    # ---- reading and writing -------------------------------------------------------------------
    @classmethod
    def from_env(cls, environ=os.environ) -> "HubSettings":
        """Defaults, overridden by TAS_HUB_ROOT, TAS_HUB_ENVS, TAS_HUB_PORT, ... (the field name in capitals)."""
        values = {}
        for f in fields(cls):
            raw = environ.get(f"TAS_HUB_{f.name.upper()}")
            if raw is not None:
                values[f.name] = f.type(raw) if f.type in (int, float) else raw
        return cls(**values)

    def save(self) -> Path:
        path = self.state / "settings.json"
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def load(cls, path: Path) -> "HubSettings":
        return cls(**json.loads(Path(path).read_text()))
