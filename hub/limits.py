"""Per-user CPU and memory limits with cgroups the hub creates for itself (and removes), v1 or v2.

JupyterHub's LocalProcessSpawner accepts ``mem_limit``/``cpu_limit`` but does not enforce them; SystemdSpawner
does, with systemd. This module enforces them without systemd: one cgroup per user under
``<hierarchy>/<hub name>/<user>`` (the grader's ``ControlGroup``), joined by the server process itself before it
drops to the user's uid, so the server, its kernels and every rank a lesson forks are inside it. Where cgroups are
not writable, the hub logs one warning and the servers run without limits.
"""
from pathlib import Path

from autograder.grader.sandbox.cgroups import ControlGroup

CGROUP = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 100_000


class UserCgroups:
    def __init__(self, hub_name: str, root: Path = CGROUP):
        self.hub_name, self.root = hub_name, Path(root)
        self.v2 = (self.root / "cgroup.controllers").exists()

    def group(self, user: str) -> ControlGroup:
        if self.v2:
            return ControlGroup({"unified": self.root / self.hub_name / user})
        return ControlGroup({c: self.root / c / self.hub_name / user for c in ("memory", "cpu")
                             if (self.root / c).is_dir()})

    def prepare(self, user: str, mem_bytes: int | None, cpus: float | None) -> ControlGroup:
        """Create the user's cgroup with the limits; the server joins it (``ControlGroup.join``). Raises OSError where
        cgroups cannot be created (the caller warns and goes on without limits)."""
        group = self.group(user)
        if not group.folders:
            raise OSError(f"no memory or cpu cgroup controller under {self.root}")
        if self.v2:  # the hub's own level must hand the controllers down
            (self.root / self.hub_name).mkdir(exist_ok=True)
            for level in (self.root, self.root / self.hub_name):
                (level / "cgroup.subtree_control").write_text("+memory +cpu")
        limits = {}
        if mem_bytes:
            limits["memory.max" if self.v2 else "memory.limit_in_bytes"] = mem_bytes
        if cpus:
            quota = int(cpus * CFS_PERIOD_US)
            limits.update({"cpu.max": f"{quota} {CFS_PERIOD_US}"} if self.v2 else
                          {"cpu.cfs_period_us": CFS_PERIOD_US, "cpu.cfs_quota_us": quota})
        group.create(limits)
        return group

    def limits_of(self, user: str) -> dict[str, int]:
        """The limits in force for ``user`` (memory bytes, CPU quota and period in µs), read back from the files."""
        group = self.group(user)
        if self.v2:
            quota, period = group.read("cpu.max").split()
            return {"memory": int(group.read("memory.max").replace("max", "-1")), "cpu_quota": int(quota.replace("max", "-1")),
                    "cpu_period": int(period)}
        return {"memory": int(group.read("memory.limit_in_bytes")), "cpu_quota": int(group.read("cpu.cfs_quota_us")),
                "cpu_period": int(group.read("cpu.cfs_period_us"))}

    def members(self, user: str) -> set[int]:
        return self.group(user).members()

    def remove(self, user: str | None = None) -> None:
        """Remove the user's cgroup (or all of this hub's); one that still holds processes stays."""
        users = [user] if user else sorted({p.name for c in (["."] if self.v2 else ["memory", "cpu"])
                                            for p in (self.root / c / self.hub_name).glob("*") if p.is_dir()})
        for name in users:
            self.group(name).remove(kill=False)
        if not user:
            for c in ["."] if self.v2 else ["memory", "cpu"]:
                ControlGroup({c: self.root / c / self.hub_name}).remove(kill=False)
