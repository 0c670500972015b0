"""Run INSIDE a grading sandbox (fed to ``python -`` on stdin): two ranks of the grader's own launcher
(``exercises.ranks.run_on_ranks``) try to move data past the loopback counters, each channel in turn, and try to
stop the launcher and each other. Prints one JSON line: {"channels": {name: "moved N bytes" | error}, ...}.

argv[1]: "isolate" (every rank runs ``isolation.isolate_rank`` first, as in class grading) or "plain" (control).
Rank 0 offers a buffer and makes itself dumpable, as a cheating student would; rank 1 tries to fetch it. The ranks
exchange addresses (a few bytes) through gloo, which the grader allows and counts.
"""
import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist

from autograder.exercises.beside import ranks
from autograder.grader.sandbox import isolation

SIZE = 4 << 20
DATA = bytes([7]) * SIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
CHANNELS = ("abstract_unix", "path_unix", "dev_shm_file", "tmp_file", "tmp_relative", "fifo", "process_vm_readv",
            "proc_mem", "sysv_shm", "posix_mqueue", "proc_fd_pipe", "output_reopen", "pty", "root_folder_file",
            "proc_root", "inherited_file")
INHERITED = []  # the task's output file, open in the launcher before the ranks fork (as worker.py's once stayed)


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def fail_errno(what):
    code = ctypes.get_errno()
    raise OSError(code, f"{what}: {os.strerror(code)}")


def share(obj):
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def offer(channel, keep):
    """Rank 0: put DATA where rank 1 may find it; returns what rank 1 needs to know."""
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: a cheater lets its sibling read it
    info = {"pid": os.getpid()}
    if channel in ("abstract_unix", "path_unix"):
        server = socket.socket(socket.AF_UNIX)
        server.bind("\0grader-side" if channel == "abstract_unix" else "/tmp/side.sock")
        server.listen(1)
        server.settimeout(5)

        def serve():
            try:
                conn, _ = server.accept()
                conn.sendall(DATA)
                conn.close()
            except OSError:
                pass
        threading.Thread(target=serve, daemon=True).start()
        keep.append(server)
    elif channel == "dev_shm_file":
        open("/dev/shm/side", "wb").write(DATA)
    elif channel in ("tmp_file", "proc_root"):
        open("/tmp/side", "wb").write(DATA)
    elif channel == "tmp_relative":
        open("side-relative", "wb").write(DATA)
    elif channel == "fifo":
        os.mkfifo("/tmp/side.fifo")

        def feed():
            try:
                fd = os.open("/tmp/side.fifo", os.O_WRONLY)
                os.write(fd, DATA[:65536])
                os.close(fd)
            except OSError:
                pass
        threading.Thread(target=feed, daemon=True).start()
    elif channel in ("process_vm_readv", "proc_mem"):
        buf = ctypes.create_string_buffer(DATA, SIZE)
        keep.append(buf)
        info["address"] = ctypes.addressof(buf)
    elif channel == "sysv_shm":
        shmid = libc.shmget(0x5B1CE, SIZE, 0o1666)
        if shmid < 0:
            fail_errno("shmget")
        address = libc.shmat(shmid, None, 0)
        ctypes.memmove(address, DATA, SIZE)
    elif channel == "posix_mqueue":
        fd = libc.mq_open(b"/grader-side", os.O_CREAT | os.O_WRONLY, 0o666, None)
        if fd < 0:
            fail_errno("mq_open")
        if libc.mq_send(fd, DATA[:4096], ctypes.c_size_t(4096), 0) < 0:
            fail_errno("mq_send")
    elif channel == "proc_fd_pipe":
        read_end, write_end = os.pipe()
        os.write(write_end, DATA[:65536])
        info["fd"] = read_end
    elif channel == "output_reopen":
        os.write(1, DATA[:65536])
    elif channel == "inherited_file":  # written through the launcher's descriptor, read back by reopening it
        os.pwrite(INHERITED[0], DATA[:65536], 0)
        info["fd"] = INHERITED[0]
    elif channel == "pty":
        master = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)
        libc.unlockpt(master)
        libc.ptsname.restype = ctypes.c_char_p
        info["pts"] = libc.ptsname(master).decode()
        keep.append(master)

        def feed_pty():
            time.sleep(0.5)
            os.write(master, b"x" * 2048 + b"\n")
        threading.Thread(target=feed_pty, daemon=True).start()
    elif channel == "root_folder_file":
        for folder in ("/", "/dev", os.path.dirname(os.path.dirname(isolation.__file__))):
            try:
                path = os.path.join(folder, "grader-side")
                open(path, "wb").write(DATA)
                info["path"] = path
                break
            except OSError as exc:
                info.setdefault("errors", []).append(f"{folder}: {exc.strerror}")
        else:
            raise OSError(", ".join(info["errors"]))
    return info


def fetch(channel, peer) -> int:
    """Rank 1: the number of DATA's bytes it got."""
    if channel in ("abstract_unix", "path_unix"):
        client = socket.socket(socket.AF_UNIX)
        client.settimeout(5)
        client.connect("\0grader-side" if channel == "abstract_unix" else "/tmp/side.sock")
        got = b""
        while chunk := client.recv(1 << 20):
            got += chunk
        return len(got) if got == DATA[:len(got)] else 0
    if channel == "dev_shm_file":
        return len(open("/dev/shm/side", "rb").read())
    if channel == "tmp_file":
        return len(open("/tmp/side", "rb").read())
    if channel == "tmp_relative":
        return len(open("side-relative", "rb").read())
    if channel == "fifo":
        fd = os.open("/tmp/side.fifo", os.O_RDONLY)
        return len(os.read(fd, 65536))
    if channel == "process_vm_readv":
        target = ctypes.create_string_buffer(SIZE)
        local, remote = IoVec(ctypes.addressof(target), SIZE), IoVec(peer["address"], SIZE)
        n = libc.process_vm_readv(peer["pid"], ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n < 0:
            fail_errno("process_vm_readv")
        return n
    if channel == "proc_mem":
        with open(f"/proc/{peer['pid']}/mem", "rb") as f:
            f.seek(peer["address"])
            return len(f.read(SIZE))
    if channel == "sysv_shm":
        shmid = libc.shmget(0x5B1CE, SIZE, 0o666)
        if shmid < 0:
            fail_errno("shmget")
        return len(ctypes.string_at(libc.shmat(shmid, None, 0), SIZE))
    if channel == "posix_mqueue":
        fd = libc.mq_open(b"/grader-side", os.O_RDONLY)
        if fd < 0:
            fail_errno("mq_open")
        buf = ctypes.create_string_buffer(8192)
        n = libc.mq_receive(fd, buf, ctypes.c_size_t(8192), None)
        if n < 0:
            fail_errno("mq_receive")
        return n
    if channel == "proc_fd_pipe":
        fd = os.open(f"/proc/{peer['pid']}/fd/{peer['fd']}", os.O_RDONLY | os.O_NONBLOCK)
        return len(os.read(fd, 65536))
    if channel == "output_reopen":
        fd = os.open("/proc/self/fd/1", os.O_RDONLY)
        return os.read(fd, 1 << 20).count(b"\x07")
    if channel == "inherited_file":
        fd = os.open(f"/proc/self/fd/{peer['fd']}", os.O_RDONLY)
        return os.read(fd, 1 << 20).count(b"\x07")
    if channel == "pty":
        fd = os.open(peer["pts"], os.O_RDONLY | os.O_NOCTTY)
        return len(os.read(fd, 4096))
    if channel == "root_folder_file":
        return len(open(peer["path"], "rb").read())
    if channel == "proc_root":
        return len(open(f"/proc/{peer['pid']}/root/tmp/side", "rb").read())
    raise ValueError(channel)


def channel_rank(rank, world_size, channel):
    keep, result = [], ""
    try:
        info = offer(channel, keep) if rank == 0 else None
    except OSError as exc:
        info = {"error": f"offer: {exc}"}
    peer = share(info)
    if rank == 1:
        if "error" in peer:
            result = peer["error"]
        else:
            try:
                got = fetch(channel, peer)
                result = f"moved {got} bytes" if got >= 1024 else f"moved only {got} bytes"
            except OSError as exc:
                result = f"{type(exc).__name__}: {exc}"
    dist.barrier()
    return result


def nested_user_namespace() -> str:
    """In a forked child (unshare needs one thread): a user namespace of its own would let a rank mount a tmpfs
    that no meter sees."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        made = libc.unshare(0x10000000) == 0  # CLONE_NEWUSER
        os.write(write_end, b"made" if made else os.strerror(ctypes.get_errno()).encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    return os.read(read_end, 200).decode()


def signal_rank(rank, world_size, _):
    """Rank 1 sends SIGSTOP to the launcher (its parent) and to rank 0; both must be refused."""
    pids = [None, None]
    dist.all_gather_object(pids, os.getpid())
    outcome = {}
    if rank == 1:
        for name, pid in (("launcher", os.getppid()), ("sibling", pids[0])):
            try:
                os.kill(pid, signal.SIGSTOP)
                outcome[name] = "stopped"
                os.kill(pid, signal.SIGCONT)
            except OSError as exc:
                outcome[name] = exc.strerror
        outcome["nested_user_namespace"] = nested_user_namespace()
    dist.barrier()
    return outcome


def main():
    torch.set_num_threads(1)
    report = os.dup(1)  # the ranks print to a file, as a grading task does (worker.py)
    out = os.open("task-output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1), os.dup2(out, 2)
    INHERITED.append(out)  # left open, as the worker once did
    if sys.argv[1] == "isolate":
        ranks.configure(child_setup=lambda: isolation.isolate_rank(64 << 20, keep_fds=ranks.rank_fds()))
    found = {}
    for channel in CHANNELS:
        result = ranks.run_on_ranks(channel_rank, 2, channel, timeout=30)
        found[channel] = result["ranks"][1] if "ranks" in result else result["error"]
    result = ranks.run_on_ranks(signal_rank, 2, None, timeout=30)
    signals = result["ranks"][1] if "ranks" in result else result["error"]
    os.write(report, (json.dumps({"uid": os.getuid(), "channels": found, "signals": signals}) + "\n").encode())


if __name__ == "__main__":
    main()
