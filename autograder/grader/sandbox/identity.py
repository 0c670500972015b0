"""One kernel identity per worker for an unprivileged grader: its subordinate uids.

Per-user kernel quotas (epoll and inotify watches, pipe pages, message queues) count per kernel uid. A root grader
gives each worker its own uid (``UidPool``); an ordinary user's workers would all share the grader's uid, so one
student who fills the epoll-watch quota makes gloo abort in every other student's ranks (issue 25). Where
``/etc/subuid`` and ``/etc/subgid`` give the grader's user ranges and ``newuidmap``/``newgidmap`` exist, each worker
starts inside ``unshare --map-root-user --map-users=...``: the grader is root there, and the worker's uid 64000+i
(``UidPool``, setpriv, as for a root grader) is the kernel uid <range start>+i, its own.
"""
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

MAX_WORKERS = 1024   # inner uids UID_BASE .. UID_BASE + 1023: below 65534 (nobody), and enough concurrent workers


@dataclass(frozen=True)
class SubIds:
    uid_start: int
    gid_start: int
    count: int

    def prefix(self, inner_base: int, namespaces: int) -> list[str]:
        """The command that runs a worker as root of a user namespace where ``inner_base`` + i is our subordinate
        uid (and gid) start + i, and where at most ``namespaces`` user, mount and IPC namespaces can be made.

        Namespace counts, unlike epoll watches, add up across user namespaces to the grader's own uid (the kernel's
        default is about 100,000 user namespaces per uid): without a bound of its own, one worker could use them all
        and every other worker's ranks could not be isolated (isolation.py)."""
        bound = " && ".join(f"echo {namespaces} > /proc/sys/user/max_{kind}_namespaces" for kind in ("user", "mnt", "ipc"))
        return ["unshare", "--map-root-user", f"--map-users={self.uid_start},{inner_base},{self.count}",
                f"--map-groups={self.gid_start},{inner_base},{self.count}", "--",
                "/bin/sh", "-c", f'{bound} && exec "$@"', "bound-namespaces"]

    def describe(self) -> str:
        return f"subordinate uids {self.uid_start}-{self.uid_start + self.count - 1}"


def _first_range(path: str, names: set[str]) -> tuple[int, int] | None:
    """The first ``name:start:count`` range of ``names`` (a user name or its uid) in /etc/subuid or /etc/subgid."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in names and parts[1].isdigit() and parts[2].isdigit() and int(parts[2]) > 0:
            return int(parts[1]), int(parts[2])
    return None


def subordinate_ids(uid: int | None = None, files: tuple[str, str] = ("/etc/subuid", "/etc/subgid")) -> SubIds | None:
    """This user's subordinate uid and gid ranges, or None (no entry, or no newuidmap/newgidmap to use them)."""
    uid = os.geteuid() if uid is None else uid
    names = {str(uid)}
    try:
        names.add(pwd.getpwuid(uid).pw_name)
    except KeyError:
        pass
    uids, gids = _first_range(files[0], names), _first_range(files[1], names)
    if not (uids and gids and shutil.which("newuidmap") and shutil.which("newgidmap") and shutil.which("unshare")):
        return None
    return SubIds(uids[0], gids[0], min(uids[1], gids[1], MAX_WORKERS))


def works(subids: SubIds, inner_base: int) -> str:
    """"" when a worker can start that way here, else why not."""
    try:
        probe = subprocess.run(subids.prefix(inner_base, 64) + ["setpriv", f"--reuid={inner_base}", f"--regid={inner_base}",
                                                            "--clear-groups", "true"],
                               capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if probe.returncode == 0 else probe.stderr.decode(errors="replace").strip()[-300:] or "unshare failed"
