"""The one place that owns ranks and process groups (the picotron way).

``launch(fn, world_size)`` forks ``world_size`` local processes, gives each an initialised
process group, runs ``fn(rank, world_size, *args)`` in each and returns the list of what
the ranks returned (rank order). The same ``fn`` runs unchanged under ``torchrun``: see
``run_under_torchrun``.

Why fork: a notebook's functions live in ``__main__``, which ``spawn`` cannot pickle.
Why ``torch.set_num_threads(1)`` in every child: a forked child hangs in its first parallel
op when the parent (a Jupyter kernel, say) already started torch's OpenMP pool.
"""
import contextlib
import datetime
import faulthandler
import gc
import os
import signal
import socket
import tempfile
import time
import traceback
from multiprocessing import connection, get_context

# Ask NVML, not the CUDA driver, whether GPUs exist: `torch.cuda.is_available()` must not initialise CUDA
# in the parent, or forked NCCL ranks cannot use it (PyTorch's documented switch; set before the first call).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


class RankFailed(RuntimeError):
    """A rank raised or died; the message carries its traceback."""


class RanksTimedOut(RuntimeError):
    """Some ranks did not finish in time, most often a collective only some ranks called."""


def backend_for(world_size: int) -> str:
    """NCCL when every rank can have its own GPU, else gloo (CPU)."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def rank_device(backend: str, rank: int) -> torch.device:
    """The device of local rank ``rank``: its GPU under NCCL, the CPU under gloo."""
    return torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")


def local_rank() -> int:
    """This process's rank on its own machine: it picks the GPU. ``launch`` and ``torchrun`` both set
    ``LOCAL_RANK``; the global rank would name a GPU that does not exist on the second machine of a job."""
    return int(os.environ.get("LOCAL_RANK", dist.get_rank()))


def my_device() -> torch.device:
    """Inside a rank: its GPU under NCCL (chosen by the local rank), the CPU under gloo."""
    return rank_device(dist.get_backend(), local_rank())


def barrier(device: torch.device) -> None:
    """All ranks meet; NCCL is told which GPU to use (else it guesses and warns)."""
    dist.barrier(device_ids=[device.index]) if device.type == "cuda" else dist.barrier()


def free_port() -> int:
    """A port free right now on this machine (for a rendezvous address, e.g. torchrun's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def store_socket() -> socket.socket:
    """The socket rank 0's store will listen on, made before any rank starts: a rank that gets there first then
    waits in its backlog instead of being refused (torch would retry only after up to a second)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    return listener


def _run_rank(rank, world_size, listener, backend, timeout_s, fn, args, result_pipe, strict=False, crash_log=None):
    torch.set_num_threads(1)
    if crash_log is not None:  # a rank killed by a signal (a crash inside torch) leaves its Python stacks here
        faulthandler.enable(file=crash_log, all_threads=True)
    port, timeout = listener.getsockname()[1], datetime.timedelta(seconds=timeout_s)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        if rank == 0:
            store = dist.TCPStore("127.0.0.1", port, world_size, True, timeout, master_listen_fd=listener.detach())
        else:
            listener.close()
            store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        with contextlib.ExitStack() as nccl_rules:
            if strict and backend == "gloo":
                from coursekit.gpu_semantics import nccl_p2p_order
                from coursekit.rank_device import off_device_refused

                nccl_rules.enter_context(nccl_p2p_order())
                nccl_rules.enter_context(off_device_refused())
            result = fn(rank, world_size, *args)
        result_pipe.send(("ok", result))
    except BaseException as exc:  # report everything, KeyboardInterrupt and SystemExit included
        result_pipe.send(("error", "".join(traceback.format_exception(exc))))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        result_pipe.close()


def died(rank: int, exitcode: int | None, crash_log) -> str:
    """What a rank that exited without sending a result leaves to say: its exit code or signal, and the Python
    stacks faulthandler wrote when a signal (an abort or a crash inside torch) killed it."""
    how = f"exit code {exitcode}"
    if exitcode is not None and exitcode < 0:
        with contextlib.suppress(ValueError):
            how = f"killed by {signal.Signals(-exitcode).name}"
    crash_log.seek(0)
    stacks = crash_log.read(4000).decode(errors="replace").strip()
    return f"rank {rank} died without a result ({how})" + (f"; where it was:\n{stacks}" if stacks else "")


def launch(fn, world_size: int = 2, *args, backend: str | None = None, timeout: float = 60.0,
           strict: bool = False) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` forked ranks; return their results.

    ``strict``: gloo ranks get NCCL's rules: its point-to-point order (``coursekit.gpu_semantics``: a ring that would
    hang on GPUs raises instead of running) and its device rule (``coursekit.rank_device``: a collective given a
    tensor made without the rank's device raises).

    Raises ``RankFailed`` with the first failing rank's traceback, or ``RanksTimedOut`` when
    ranks are still running after ``timeout`` seconds. Either way no process is left behind.
    """
    backend = backend or backend_for(world_size)
    if backend == "nccl" and torch.cuda.is_initialized():
        raise RuntimeError("CUDA is already initialised in this process, and forked ranks cannot use it. "
                           "Restart the kernel and call launch() before any other CUDA work, "
                           "or run the lesson's torchrun script.")
    ctx = get_context("fork")
    listener = store_socket()
    procs, pending = [], {}
    crash_logs = [tempfile.TemporaryFile() for _ in range(world_size)]
    for rank in range(world_size):
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_run_rank, name=f"rank{rank}",
                           args=(rank, world_size, listener, backend, timeout, fn, args, send, strict,
                                 crash_logs[rank]))
        proc.start()
        send.close()
        procs.append(proc)
        pending[receive] = rank
    listener.close()  # rank 0 has its own copy
    results, failures = [None] * world_size, {}
    deadline = time.monotonic() + timeout
    try:
        while pending and not failures:
            ready = connection.wait(list(pending), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for pipe in ready:
                rank = pending.pop(pipe)
                try:
                    status, payload = pipe.recv()
                except EOFError:
                    procs[rank].join(1)
                    status, payload = "error", died(rank, procs[rank].exitcode, crash_logs[rank])
                if status == "ok":
                    results[rank] = payload
                else:
                    failures[rank] = payload
    finally:
        for proc in procs:  # a failed rank leaves its peers blocked in a collective: stop them
            proc.join(timeout=0 if (failures or pending) else 5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for log in crash_logs:
            log.close()
    if failures:
        rank = min(failures)
        hint = ""
        if "by peer" in failures[rank]:  # gloo's words when the other end of a collective went away
            hint = ("\n(Another rank had already finished or died while this one waited in a collective: "
                    "every rank must call the same collectives in the same order.)")
        raise RankFailed(f"rank {rank} of {world_size} failed:\n{failures[rank]}{hint}")
    if pending:
        stuck = sorted(pending.values())
        raise RanksTimedOut(f"rank(s) {stuck} of {world_size} were still running after {timeout:.0f} s: most often "
                            "a collective that not every rank called, so the others wait forever")
    return results


def run_under_torchrun(fn, *args):
    """Run ``fn(rank, world_size, *args)`` in a process started by ``torchrun``; return its result."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend = backend_for(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    try:
        result = fn(rank, world_size, *args)
        # A clean exit: every rank is done with its collectives before any rank tears its group down, and whatever
        # still holds the group is freed now, not during interpreter shutdown. Without these, a gloo worker now and
        # then aborted at exit ("terminate called without an active exception") after its peer had left, and the
        # other node's torchrun agent then waited out its exit barrier.
        barrier(my_device())
        return result
    finally:
        gc.collect()
        dist.destroy_process_group()
