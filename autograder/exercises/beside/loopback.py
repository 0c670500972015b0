"""A loopback of the ranks' own: a network namespace that carries only their traffic, so that the launcher's count
of the bytes they send (meter.py) is theirs alone on a student's machine too, not only in the grader's sandbox.

The launcher forks a *holder* that makes a user namespace (mapping the user's own ids to themselves, so files keep
their owners) with a network namespace in it, brings its loopback up and waits. Every rank joins both namespaces
first thing (a forked child is single-threaded, as ``setns`` into a user namespace requires), and the launcher reads
the holder's ``/proc/<pid>/net/dev``. The holder also makes the socket rank 0's store listens on (``store_socket``:
a socket belongs to the network namespace it was made in). Where the kernel refuses unprivileged user namespaces
(some distributions do), ``PrivateLoopback.start`` returns None: the ranks share the machine's loopback and byte
checks judge nothing (checking.measured_privately).
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


def store_socket() -> socket.socket:
    """A listening socket for rank 0's TCPStore, made before any rank is forked: a rank that connects before rank 0
    has started its store waits in the backlog instead of being refused (c10d would retry only after up to a
    second, a loaded machine's usual case), and no other process can take the port in between."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    return listener


class PrivateLoopback:
    def __init__(self, holder: int, channel: socket.socket):
        self.holder, self.channel = holder, channel

    @classmethod
    def start(cls) -> "PrivateLoopback | None":
        """A holder of fresh namespaces, or None where they cannot be made here."""
        uid, gid = os.getuid(), os.getgid()
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            try:
                ours.close()
                _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNET), "unshare")
                Path("/proc/self/setgroups").write_text("deny")
                Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
                Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
                _bring_loopback_up()
                theirs.send(b"1")
                while theirs.recv(1):  # a request for a listening socket, until stop() kills it
                    with store_socket() as listener:
                        socket.send_fds(theirs, [b"s"], [listener.fileno()])
            finally:
                os._exit(0)
        theirs.close()
        if ours.recv(1) != b"1":
            ours.close()
            os.waitpid(pid, 0)
            return None
        return cls(pid, ours)

    def store_socket(self) -> socket.socket:
        """A socket listening on 127.0.0.1 of this loopback (on a port of its own): ``store_socket`` made there."""
        self.channel.send(b"?")
        _, fds, _, _ = socket.recv_fds(self.channel, 1, 1)
        return socket.socket(fileno=fds[0])

    def join(self) -> None:
        """In a rank, before anything else: enter the holder's user and network namespaces."""
        self.channel.close()  # the launcher's, to ask the holder for sockets
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
        self.channel.close()
        try:
            os.kill(self.holder, signal.SIGKILL)
            os.waitpid(self.holder, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
