"""A loopback of the ranks' own: a network namespace that carries only their traffic, so that the launcher's count
of the bytes they send (meter.py) is theirs alone on a student's machine too, not only in the grader's sandbox.

The launcher forks a *holder* that makes a user namespace (mapping the user's own ids to themselves, so files keep
their owners) with a network namespace in it, brings its loopback up and waits. Every rank joins both namespaces
first thing (a forked child is single-threaded, as ``setns`` into a user namespace requires), and the launcher reads
the holder's ``/proc/<pid>/net/dev``. Where the kernel refuses unprivileged user namespaces (some distributions
do), ``PrivateLoopback.start`` returns None: the ranks share the machine's loopback and byte checks judge nothing
(reading.measured_privately).
"""
import ctypes
import fcntl
import os
import signal
import socket
import struct
from pathlib import Path

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _bring_loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH", b"lo", 0))[:18])[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def tx_bytes(net_dev: str = "/proc/net/dev") -> int | None:
    """Bytes sent so far on the loopback of the network namespace that ``net_dev`` describes."""
    try:
        for line in Path(net_dev).read_text().splitlines():
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[8])
    except (OSError, ValueError, IndexError):
        pass
    return None


class PrivateLoopback:
    def __init__(self, holder: int):
        self.holder = holder

    @classmethod
    def start(cls) -> "PrivateLoopback | None":
        """A holder of fresh namespaces, or None where they cannot be made here."""
        uid, gid = os.getuid(), os.getgid()
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(ready_r)
                _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNET), "unshare")
                Path("/proc/self/setgroups").write_text("deny")
                Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
                Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
                _bring_loopback_up()
                os.write(ready_w, b"1")
                while True:
                    signal.pause()  # until stop() kills it
            finally:
                os._exit(0)
        os.close(ready_w)
        ready = os.read(ready_r, 1) == b"1"
        os.close(ready_r)
        if not ready:
            os.waitpid(pid, 0)
            return None
        return cls(pid)

    def join(self) -> None:
        """In a rank, before anything else: enter the holder's user and network namespaces."""
        fds = [os.open(f"/proc/{self.holder}/ns/{kind}", os.O_RDONLY) for kind in ("user", "net")]  # both first:
        try:  # once in the user namespace, the holder's /proc files are no longer ours to open
            for fd, kind in zip(fds, ("user", "net")):
                _check(_libc.setns(fd, 0), f"setns {kind}")
        finally:
            for fd in fds:
                os.close(fd)

    def tx_bytes(self) -> int | None:
        return tx_bytes(f"/proc/{self.holder}/net/dev")

    def stop(self) -> None:
        try:
            os.kill(self.holder, signal.SIGKILL)
            os.waitpid(self.holder, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
