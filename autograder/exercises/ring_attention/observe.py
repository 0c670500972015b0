"""Observing ``ring_attention`` on real ranks: each rank draws only its own chunk."""
import math

import torch

import coursekit  # noqa: F401  keeps the profiler's back end quiet on stderr (KINETO_LOG_LEVEL)
from coursekit.gpu_semantics import nccl_p2p_order

from ..beside.meter import PEAK_SAMPLE_S, SampleAtGates
from ..beside.observing import collective_counts, float32_data, sketch, tensor_data
from ..beside.ranks import ask_gate, observe_on_ranks, student_call, trim_memory
from .cases import FINGERPRINT_COLUMNS, cases


def rank_chunk(case: dict, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of positions [rank·chunk, (rank+1)·chunk): (*lead, chunk, d) float32, from this rank's own seed."""
    generator = torch.Generator().manual_seed(case["seed"] * 16 + rank)
    shape = (*case["lead"], case["chunk"], case["d"])
    return tuple(torch.randn(shape, generator=generator) for _ in range(3))


def full_attention(case: dict) -> list[list[float]]:
    """The whole sequence's attention in float64 (the ground truth), as each rank's flat rows (in the memory
    scenario, the first FINGERPRINT_COLUMNS columns of each row)."""
    chunks = [rank_chunk(case, r) for r in range(case["world_size"])]
    q, k, v = (torch.cat([c[i] for c in chunks], dim=-2).double() for i in range(3))
    if case["measure_memory"]:
        v = v[..., :FINGERPRINT_COLUMNS]
    scores = q @ k.transpose(-2, -1) / math.sqrt(case["d"])
    if case["is_causal"]:
        n = scores.size(-1)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = scores.softmax(-1) @ v
    return [tensor_data(part) for part in out.split(case["chunk"], dim=-2)]


def averaged_partials(case: dict) -> list[list[float]]:
    """What averaging each chunk's own softmax output gives, per rank (not the answer: the diagnosis checks that a
    ring told "you average the partial outputs" really does)."""
    chunks = [rank_chunk(case, r) for r in range(case["world_size"])]
    out = []
    for r, (q, _, _) in enumerate(chunks):
        parts = []
        for c, (_, k, v) in enumerate(chunks[:r + 1] if case["is_causal"] else chunks):
            v = v.double()[..., :FINGERPRINT_COLUMNS] if case["measure_memory"] else v.double()
            scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(case["d"])
            if case["is_causal"] and c == r:
                n = scores.size(-1)
                scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            parts.append(scores.softmax(-1) @ v)
        out.append(tensor_data(sum(parts) / len(parts)))
    return out


# ---- observing: real ranks, the grader's own record of what travelled ---------------------------------

class P2PLog:
    """Every point-to-point message of this rank: (peer, values). Patched on the process group's class after the
    fork (dist.send/recv/isend/irecv and batch_isend_irecv all call these methods), so it dies with the rank.

    ``gates``: before each send the rank hands its free heap pages back (they would count as held when the launching
    process's heap lent them) and stops at a gate, where the launcher reads the memory it holds (meter.py): a ring
    sends N−1 times, each time holding the chunk it sends and the buffer it receives into."""

    def __init__(self, gates: bool = False):
        import torch.distributed as dist

        self.sends, self.recvs = [], []
        send, recv = dist.ProcessGroup.send, dist.ProcessGroup.recv

        def logged_send(group, tensors, dst, *args, **kwargs):
            self.sends.append([int(dst), sum(int(t.numel()) for t in tensors)])
            if gates:
                trim_memory()
                ask_gate("send", torch.zeros(1))
            return send(group, tensors, dst, *args, **kwargs)

        def logged_recv(group, tensors, src, *args, **kwargs):
            self.recvs.append([int(src), sum(int(t.numel()) for t in tensors)])
            return recv(group, tensors, src, *args, **kwargs)

        dist.ProcessGroup.send, dist.ProcessGroup.recv = logged_send, logged_recv


def ring_rank(rank: int, world_size: int, fn, case: dict) -> dict:
    """One rank: its own chunk, the student's ring attention under no_grad, what it returned and sent."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v = rank_chunk(case, rank)
    if not case["measure_memory"]:  # the memory scenario hands over its only copies: the launcher measures it
        q, k, v = q.clone(), k.clone(), v.clone()
    want = tuple(q.shape)
    log = P2PLog(gates=case["measure_memory"])
    # nccl_p2p_order: a send waits for its receive, as under NCCL (a blocking send-then-receive ring is told so)
    with nccl_p2p_order(), profile(activities=[ProfilerActivity.CPU]) as prof, torch.no_grad():
        out = student_call(fn, q, k, v, is_causal=case["is_causal"])
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        student_call(_raise, ValueError(f"ring_attention returned {got}, not this rank's rows, shape {want}"))
    found = {}
    if case["measure_memory"]:  # too large to keep: a few columns (feedback) and a sketch of all of it (evidence)
        found["sketch"] = sketch(out, case["seed"])
        out = out[..., :FINGERPRINT_COLUMNS]
    return {"output": float32_data(out), **found, "sends": log.sends, "recvs": log.recvs,
            "collectives": collective_counts(prof, leave_out=("send", "recv"))}


def _raise(exc: Exception):
    raise exc


class HopFloors(SampleAtGates):
    """Readings the launcher takes on its own, at moments no rank asks for or sees: at every tick (``tick_s``) it
    reads each rank's memory and places the reading by the bytes on the ranks' loopback at that moment. Hop h of
    the ring (h = 1 … N−1) is under way while they have sent between (h − 1)·N and h·N chunks of K and V. Per rank
    and hop the least it held then (its *floor*): what it kept all through that hop, whatever it allocated and
    freed within it, so the merge's short-lived temporaries, which a sampled peak counts, drop out. Readings once
    every hop's bytes are sent are not placed (a rank may have returned by then), nor those of a rank that has
    ended (0 held: a running rank holds at least the q, k and v the grader handed it). The rank's own requests at
    its sends are still answered and recorded (``SampleAtGates``); a floor needs none of them."""

    tick_s = PEAK_SAMPLE_S

    def __init__(self, world_size: int, hop_bytes: int):
        super().__init__(world_size)
        self.hop_bytes = hop_bytes
        self.floors = [[0] * (world_size - 1) for _ in range(world_size)]  # 0: no reading (the record stays numbers)

    def tick(self, meter) -> list:
        sent = meter.sent()
        hop = None if sent is None else int(sent // self.hop_bytes)
        if hop is None or hop >= self.world_size - 1:
            return []
        for rank, held in enumerate(meter.measure(meter.pids, meter.baseline)):
            if held:
                floors = self.floors[rank]
                floors[hop] = min(floors[hop], held) if floors[hop] else held
        return []

    def result(self) -> dict:
        return {**super().result(), "floors": self.floors, "hop_bytes": self.hop_bytes}


def chunk_bytes(case: dict) -> int:
    """One rank's K and V in float32: what a ring sends at each hop."""
    return 2 * math.prod(case["lead"]) * case["chunk"] * case["d"] * 4


def gates_of(case: dict):
    if not case["measure_memory"]:
        return None
    return HopFloors(case["world_size"], case["world_size"] * chunk_bytes(case))


def observe(fn, *, salt: int = 0) -> dict:
    # quiet: gloo's own abort message on a message of the wrong size would reach the notebook's stderr
    return observe_on_ranks(salt, cases(salt), ring_rank, fn, gates=gates_of, peaks=lambda case: case["measure_memory"],
                            profiler=True, quiet=True)


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    result["full"] = {name: full_attention(s["case"]) for name, s in result["scenarios"].items()}
    result["averaged"] = {name: averaged_partials(s["case"]) for name, s in result["scenarios"].items()}
    return result
