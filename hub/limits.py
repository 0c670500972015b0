"""Per-user CPU and memory limits with cgroups the hub creates for itself (and removes), v1 or v2.

JupyterHub's LocalProcessSpawner accepts ``mem_limit``/``cpu_limit`` but does not enforce them; SystemdSpawner
does, with systemd. This module enforces them without systemd: one cgroup per user under
``<hierarchy>/<hub name>/<user>``, joined by the server process itself before it drops to the user's uid, so
the server, its kernels and every rank a lesson forks are inside it. Where cgroups are not writable, the hub
logs one warning and the servers run without limits.
"""
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 100_000


class UserCgroups:
    def __init__(self, hub_name: str, root: Path = CGROUP):
        self.hub_name, self.root = hub_name, Path(root)
        self.v2 = (self.root / "cgroup.controllers").exists()

    def _folders(self, user: str) -> dict[str, Path]:
        if self.v2:
            return {"unified": self.root / self.hub_name / user}
        return {c: self.root / c / self.hub_name / user for c in ("memory", "cpu") if (self.root / c).is_dir()}

    def prepare(self, user: str, mem_bytes: int | None, cpus: float | None) -> list[Path]:
        """Create the user's cgroups with the limits; returns the ``cgroup.procs`` files the server must join.
        Raises OSError where cgroups cannot be created (the caller warns and goes on without limits)."""
        folders = self._folders(user)
        if not folders:
            raise OSError(f"no memory or cpu cgroup controller under {self.root}")
        if self.v2:
            parent = self.root / self.hub_name
            parent.mkdir(exist_ok=True)
            (self.root / "cgroup.subtree_control").write_text("+memory +cpu")
            (parent / "cgroup.subtree_control").write_text("+memory +cpu")
        for controller, folder in folders.items():
            folder.mkdir(parents=True, exist_ok=True)
            if mem_bytes and controller in ("memory", "unified"):
                name = "memory.max" if self.v2 else "memory.limit_in_bytes"
                (folder / name).write_text(str(mem_bytes))
            if cpus and controller in ("cpu", "unified"):
                quota = int(cpus * CFS_PERIOD_US)
                if self.v2:
                    (folder / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")
                else:
                    (folder / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
                    (folder / "cpu.cfs_quota_us").write_text(str(quota))
        return [folder / "cgroup.procs" for folder in folders.values()]

    def limits_of(self, user: str) -> dict[str, int]:
        """The limits in force for ``user`` (memory bytes, CPU quota and period in µs), read back from the files."""
        got = {}
        for controller, folder in self._folders(user).items():
            if self.v2:
                got["memory"] = int((folder / "memory.max").read_text().strip().replace("max", "-1"))
                quota, period = (folder / "cpu.max").read_text().split()
                got["cpu_quota"], got["cpu_period"] = int(quota.replace("max", "-1")), int(period)
            elif controller == "memory":
                got["memory"] = int((folder / "memory.limit_in_bytes").read_text())
            else:
                got["cpu_quota"] = int((folder / "cpu.cfs_quota_us").read_text())
                got["cpu_period"] = int((folder / "cpu.cfs_period_us").read_text())
        return got

    def members(self, user: str) -> set[int]:
        pids = set()
        for folder in self._folders(user).values():
            if (folder / "cgroup.procs").exists():
                pids |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
        return pids

    def remove(self, user: str | None = None) -> None:
        """Remove the user's cgroups (or all of this hub's); a cgroup that still holds processes stays."""
        base = [self.root / self.hub_name] if self.v2 else [self.root / c / self.hub_name for c in ("memory", "cpu")]
        for folder in base:
            targets = [folder / user] if user else ([*folder.iterdir(), folder] if folder.is_dir() else [])
            for target in targets:
                if target.is_dir():
                    try:
                        target.rmdir()  # cgroup folders are removed with rmdir, their control files go with them
                    except OSError:
                        pass


def join(procs_files: list[Path]) -> None:
    """Move the calling process into the cgroups (called in the child, before it drops privileges)."""
    for procs in procs_files:
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
