"""What each rank holds, counted over every process it started (class grading only).

The launcher's meter samples each rank's resident memory (exercises/beside/meter.py). A rank could park its data in a
child or grandchild, even one that double-forks and outlives it, and the rank's own numbers would drop. In a
grading worker every process of the sandbox's PID namespace is ours to see, so each sample charges a rank with
all its descendants (found through their parents, and remembered, since an orphan's parent becomes PID 1), and
charges every process no rank claims (an orphan seen first after its parent died) to every rank. Only the
sandbox's PID 1, the worker's zygote and the launcher itself are left out. The files a rank keeps in its private
tmpfs (isolation.py) count too, read through descriptors the rank hands over before any submitted code runs
(``send_tmpfs``): no later choice of the rank (making itself undumpable, say) can hide them.

An honest rank starts no process, so this changes nothing for it; a process a rank forks holds the rank's pages
again (copy-on-write pages count in both), which can only raise the student's own numbers.
"""
import os
import socket

from ...exercises.beside.meter import status_bytes


class RankFamilies:
    """``held(pids, baseline)`` for ``ranks.configure``: per rank, the bytes it and its processes hold above the
    baseline (None when the rank itself is gone)."""

    def __init__(self, launcher: int, zygote: int, unreadable_tmpfs: int | None = None):
        """``unreadable_tmpfs``: where each rank's private tmpfs is readable through ``/proc/<pid>/root`` (isolated
        ranks in a Landlock domain of their own), what a rank whose tmpfs cannot be read is charged: the most it can
        hold there. A rank that makes itself undumpable (``prctl(PR_SET_DUMPABLE, 0)``) then gains nothing."""
        self.ignored = {1, launcher, zygote}
        self.unreadable_tmpfs = unreadable_tmpfs
        self.ranks: list[int] = []
        self.owner: dict[int, int] = {}   # pid -> index of the rank it descends from; -1: unclaimed
        self.tmpfs: dict[int, list[int]] = {}  # rank pid -> descriptors of its private /tmp and /dev/shm
        self.inbox: socket.socket | None = None

    def tmpfs_channel(self) -> socket.socket:
        """The socket each rank hands its private tmpfs over on (``send_tmpfs``, in the rank, before submitted code).
        The launcher keeps the other end; a rank closes both (isolation.close_inherited, then after sending)."""
        self.inbox, outbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.inbox.setblocking(False)
        return outbox

    def _receive_tmpfs(self) -> None:
        while self.inbox is not None:
            try:
                pid, fds, _, _ = socket.recv_fds(self.inbox, 32, 2)
            except (BlockingIOError, OSError):
                return
            try:
                self.tmpfs[int(pid)] = fds
            except ValueError:
                for fd in fds:
                    os.close(fd)

    def _forget_tmpfs(self) -> None:
        """A descriptor keeps its tmpfs, and what is in it, alive: dropped with the scenario."""
        for fds in self.tmpfs.values():
            for fd in fds:
                os.close(fd)
        self.tmpfs.clear()

    def held(self, pids: list[int], baseline: int) -> list[int | None]:
        if pids != self.ranks:  # a new scenario: whatever the last one left is nobody's
            self.ranks, self.owner = list(pids), {pid: i for i, pid in enumerate(pids)}
            self._forget_tmpfs()
        self._receive_tmpfs()
        parents = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in self.ignored and int(name) not in self.owner:
                parents[int(name)] = _parent(int(name))
        for pid in parents:
            self._claim(pid, parents)
        totals = [None if held is None else max(0, held - baseline) + self._tmpfs(pid)
                  for pid, held in zip(pids, map(status_bytes, pids))]
        unclaimed = 0
        for pid, index in list(self.owner.items()):
            if index >= 0 and pid == pids[index]:
                continue
            held = status_bytes(pid)
            if held is None:
                del self.owner[pid]
            elif index >= 0 and totals[index] is not None:
                totals[index] += max(0, held - baseline)
            else:  # an orphan, or the child of a rank that has ended
                unclaimed += max(0, held - baseline)
        return [None if total is None else total + unclaimed for total in totals]

    def _tmpfs(self, pid: int) -> int:
        if pid in self.tmpfs:
            return sum(used_bytes(os.fstatvfs(fd)) for fd in self.tmpfs[pid])
        used = private_tmpfs_bytes(pid)
        if used is None:  # a reading that fails is never 0 where it should succeed: the worst case
            return self.unreadable_tmpfs or 0
        return used

    def _claim(self, pid: int, parents: dict[int, int | None]) -> int:
        chain = []
        while pid not in self.owner:
            chain.append(pid)
            parent = parents.get(pid)
            if parent is None or parent in self.ignored or parent in chain or parent not in parents and parent not in self.owner:
                index = -1
                break
            pid = parent
        else:
            index = self.owner[pid]
        for member in chain:
            self.owner[member] = index
        return index


def send_tmpfs(outbox: socket.socket) -> None:
    """In a rank whose private /tmp and /dev/shm were just mounted (isolation.py), before any submitted code: hand
    the launcher a descriptor of each (``RankFamilies.tmpfs_channel``), then close the channel. Where no launcher
    listens any more (its meter replaced), nothing is sent and /proc/<pid>/root stays the only way in."""
    fds = [os.open(folder, os.O_PATH | os.O_DIRECTORY) for folder in ("/tmp", "/dev/shm")]
    try:
        socket.send_fds(outbox, [str(os.getpid()).encode()], fds)
    except OSError:
        pass
    finally:
        for fd in fds:
            os.close(fd)
        outbox.close()


def used_bytes(stat: os.statvfs_result) -> int:
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def private_tmpfs_bytes(pid: int) -> int | None:
    """What a rank keeps in its private /tmp and /dev/shm (isolation.py): files written there, never mapped, hold
    memory that no resident count shows. None where the rank's root cannot be read (not isolated, or undumpable)."""
    used = 0
    for folder in ("tmp", "dev/shm"):
        try:
            stat = os.statvfs(f"/proc/{pid}/root/{folder}")
        except OSError:
            return None
        used += used_bytes(stat)
    return used


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
