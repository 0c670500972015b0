"""NCCL's point-to-point order on gloo ranks, said in words: a ring that would hang on GPUs fails at once.

Under NCCL a large send completes only when the matching receive runs (small ones may be buffered, so a ring of
blocking send-then-receive can pass a small test and hang at scale). ``nccl_p2p_order()``, called in a rank after its
process group exists, makes every send's ``wait()`` (``dist.send`` waits at once; ``isend`` when its work is waited
on) return only once the peer has posted the matching receive, whatever the size, and raises ``WouldHangUnderNCCL``
when the ranks wait for each other in a cycle of sends: the hang, named, instead of a launch timeout.
"""
import contextlib
import datetime
import os
import time

import torch.distributed as dist

POLL_S, MAX_POLL_S = 0.001, 0.02
NCCL_HANG = "would hang under NCCL"


class WouldHangUnderNCCL(RuntimeError):
    """Blocking sends that wait for each other in a cycle, none of their receives posted."""


def own_store() -> dist.Store:
    """A connection of this rank's own to the launch's store (``MASTER_ADDR``/``MASTER_PORT``, which both launchers
    set), under a prefix: the process group's own connection stays the group's."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    return dist.PrefixStore("gpu_semantics/", store)


class _SendWork:
    """A send's work whose ``wait`` first waits for the peer's matching receive."""

    def __init__(self, work, order: "_P2POrder", dst: int, number: int):
        self._work, self._order, self._dst, self._number = work, order, dst, number

    def wait(self, *args, **kwargs):
        self._order.wait_for_receive(self._dst, self._number)
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


class _P2POrder:
    def __init__(self, store, rank: int):
        self.store, self.rank, self.sent = store, rank, {}

    def _received(self, src: int, dst: int) -> int:
        return int(self.store.add(f"p2p/recv/{src}->{dst}", 0))

    def _blocked_on(self, rank: int) -> tuple[int, int] | None:
        key = f"p2p/blocked/{rank}"
        if not self.store.check([key]):
            return None
        value = self.store.get(key).decode()
        return tuple(map(int, value.split(":"))) if value else None

    def wait_for_receive(self, dst: int, number: int) -> None:
        """Return once ``dst`` has posted its ``number``-th receive from this rank; raise on a cycle of waits."""
        if self._received(self.rank, dst) >= number:
            return
        self.store.set(f"p2p/blocked/{self.rank}", f"{dst}:{number}")
        pause = POLL_S
        try:
            while self._received(self.rank, dst) < number:
                cycle = self._cycle()
                if cycle and self._cycle() == cycle:  # the same waits read twice: all stuck at once in between
                    hops = ", ".join(f"rank {a} in a send to rank {b}" for a, b, _ in cycle)
                    raise WouldHangUnderNCCL(
                        f"{NCCL_HANG}: the ranks wait for each other ({hops}) and none has posted its receive: under "
                        "NCCL a (large) send completes only when its receive runs. Post the send and the receive together "
                        "(dist.batch_isend_irecv, or isend/irecv then wait), or let even ranks send first and odd "
                        "ranks receive first.")
                time.sleep(pause)
                pause = min(2 * pause, MAX_POLL_S)  # a peer that computes for long is not polled at full rate
        finally:
            self.store.set(f"p2p/blocked/{self.rank}", "")

    def _cycle(self) -> list[tuple[int, int, int]] | None:
        """The ranks blocked in sends whose receives are not posted, if they lead back to this rank: (rank, peer,
        send number) each. One read is no snapshot (a rank may move on while the next is read); a rank's
        (peer, number) never repeats, so the same cycle read twice was stuck as a whole between the two reads."""
        edges, rank, seen = [], self.rank, set()
        while rank not in seen:
            seen.add(rank)
            blocked = self._blocked_on(rank)
            if blocked is None or self._received(rank, blocked[0]) >= blocked[1]:
                return None  # that rank is not stuck (or no longer)
            edges.append((rank, *blocked))
            rank = blocked[0]
        return edges if rank == self.rank else None


@contextlib.contextmanager
def nccl_p2p_order(linger_s: float = 5.0):
    """In a rank, after ``init_process_group``: sends wait for their matching receives inside the block (see above).
    Ranks of the default group only (a subgroup's ranks are numbered otherwise). The store lives in rank 0's
    process, so rank 0 leaves the block only when every rank has (or after ``linger_s``, if one failed)."""
    order = _P2POrder(own_store(), dist.get_rank())
    send, recv = dist.ProcessGroup.send, dist.ProcessGroup.recv
    saved = vars(dist.ProcessGroup)["send"], vars(dist.ProcessGroup)["recv"]  # descriptors, restored as they were

    def ordered_send(group, tensors, dst, *args, **kwargs):
        order.sent[dst] = number = order.sent.get(dst, 0) + 1
        return _SendWork(send(group, tensors, dst, *args, **kwargs), order, int(dst), number)

    def announced_recv(group, tensors, src, *args, **kwargs):
        order.store.add(f"p2p/recv/{int(src)}->{order.rank}", 1)  # before: posting may already wait for the data
        return recv(group, tensors, src, *args, **kwargs)

    dist.ProcessGroup.send, dist.ProcessGroup.recv = ordered_send, announced_recv
    try:
        yield
    finally:
        dist.ProcessGroup.send, dist.ProcessGroup.recv = saved
        order.store.add("p2p/done", 1)
        deadline = time.monotonic() + linger_s
        while order.rank == 0 and order.store.add("p2p/done", 0) < dist.get_world_size() and \
                time.monotonic() < deadline:
            time.sleep(POLL_S)
