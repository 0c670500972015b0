"""Observing ``FlashAttention``: values in the student's process, memory measured from outside it."""
import inspect
import math

import torch
import torch.nn.functional as F

from ..beside.observing import observation, sketch
from ..beside.ranks import run_alone
from .cases import FINGERPRINT_ROWS, cases

MEMORY_TIMEOUT_S = 40.0  # the correct tiled version takes under a second; a naive backward several


def make_inputs(case: dict):
    """Seeded q, k, v and the upstream gradient, in the scenario's dtype."""
    g = torch.Generator().manual_seed(case["seed"])
    lead, d = tuple(case["lead"]), case["d"]
    q = torch.randn(*lead, case["n_q"], d, generator=g)
    k = torch.randn(*lead, case["n_k"], d, generator=g)
    v = torch.randn(*lead, case["n_k"], d, generator=g)
    if case["logits"]:  # q·k/√d = logits × cos(angle): q and every key near one direction, so scores near logits
        norm = (case["logits"] * math.sqrt(d)) ** 0.5
        direction = torch.randn(d, generator=g)
        q, k = (direction / direction.norm() + 0.3 * t / math.sqrt(d) for t in (q, k))
        q, k = (t / t.norm(dim=-1, keepdim=True) * norm for t in (q, k))
    upstream = torch.randn(*lead, case["n_q"], d, generator=g)
    dtype = getattr(torch, case["dtype"])
    return [t.to(dtype) for t in (q, k, v)], upstream.to(dtype)


def compact(t: torch.Tensor) -> list[float]:
    """A tensor as a flat list of floats with 6 significant digits: enough for the 5e-5 the checks allow, and it
    keeps the shipped reference observations small."""
    return [float(f"{x:.6g}") for x in t.detach().double().flatten().tolist()]


def saved_for_backward(fn, *args):
    """``fn(*args)``, and every distinct storage saved for backward while it ran: [(shape, dtype, bytes)]."""
    by_storage = {}

    def record(t):
        by_storage.setdefault(t.untyped_storage().data_ptr(),
                              (list(t.shape), str(t.dtype).removeprefix("torch."), t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(record, lambda t: t):
        result = fn(*args)
    return result, list(by_storage.values())


def run_values(cls, case: dict) -> dict:
    """One call and one backward, at the grader's tiles: o, dq, dk, dv and their dtypes."""
    set_tiles(cls, case["block"])
    (q, k, v), upstream = make_inputs(case)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = cls.apply(q, k, v, case["is_causal"])
    if not isinstance(o, torch.Tensor) or o.shape != q.shape:
        got = f"shape {tuple(o.shape)}" if isinstance(o, torch.Tensor) else type(o).__name__
        raise ValueError(f"FlashAttention.apply returned {got}, not o shaped like q {tuple(q.shape)}")
    o.backward(upstream.to(o.dtype))
    grads = {name: t.grad for name, t in (("dq", q), ("dk", k), ("dv", v))}
    missing = [name for name, g in grads.items() if g is None]
    if missing:
        raise ValueError(f"backward left {', '.join(missing)} as None: return (dq, dk, dv, None)")
    return {"output": compact(o), **{name: compact(g) for name, g in grads.items()},
            "dtypes": {"output": str(o.dtype).removeprefix("torch."),
                       **{name: str(g.dtype).removeprefix("torch.") for name, g in grads.items()}}}


# The exercise's rule (no torch SDPA) by every door: in a student's ranks these kernels raise (grader/sandbox/kernels.py)
FORBIDDEN_KERNELS = tuple((name, "CompositeImplicitAutograd") for name in (
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math")) + tuple((name, "CPU") for name in (
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward")) + tuple(
    (f"_{name}", "CUDA") for name in (
        "scaled_dot_product_flash_attention", "scaled_dot_product_flash_attention_backward",
        "scaled_dot_product_efficient_attention", "scaled_dot_product_efficient_attention_backward",
        "scaled_dot_product_cudnn_attention", "scaled_dot_product_cudnn_attention_backward",
        "flash_attention_forward", "flash_attention_backward", "efficient_attention_forward",
        "efficient_attention_backward"))


def set_tiles(cls, block: int) -> None:
    """The tile sizes, in the student's cell's namespace (the exercise says the grader sets them); through any
    decorator on ``forward`` (``functools.wraps``) to the student's own function."""
    forward = getattr(cls, "forward", None)
    try:
        namespace = getattr(inspect.unwrap(forward), "__globals__", None) if callable(forward) else None
    except ValueError:  # a cycle of __wrapped__
        namespace = None
    if isinstance(namespace, dict):
        namespace["BLOCK_Q"] = namespace["BLOCK_K"] = block


def memory_run(cls, case: dict) -> dict:
    """The memory scenario. The launcher measures this process's peak memory over forward + backward from outside
    (meter.py). Recorded here, for feedback only: what forward saves, the largest tensor any
    operation made, whether torch's SDPA ran; and a fingerprint of the results (the evidence of real work)."""
    from coursekit.ops import watch_ops

    from ..beside.ranks import student_call

    set_tiles(cls, case["block"])
    (q, k, v), upstream = make_inputs(case)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    found = {}

    def forward_and_backward():
        o, found["saved"] = saved_for_backward(cls.apply, q, k, v, case["is_causal"])
        if not isinstance(o, torch.Tensor) or o.shape != q.shape:
            raise ValueError("FlashAttention.apply did not return o shaped like q")
        o.backward(upstream)
        found["o"] = o.detach()

    seen = student_call(watch_ops, forward_and_backward)
    sdpa = sorted(name for name in seen.counts if "scaled_dot_product" in name or "flash_attention" in name)
    o, dq = found["o"], q.grad
    results = {"output": o, "dq": dq, "dk": k.grad, "dv": v.grad}
    return {"forbidden": bool(sdpa), "output": compact(o[..., :FINGERPRINT_ROWS, :]),
            "dq": compact(dq[..., :FINGERPRINT_ROWS, :]) if dq is not None else None,
            "sketch": {name: None if t is None else sketch(t, case["seed"]) for name, t in results.items()},
            "saved": found["saved"], "largest_tensor": seen.largest}


def run_problem(rank: int, world_size: int, cls, case: dict) -> dict:
    """One scenario in a process of its own, which the launcher measures from outside (memory: meter.py)."""
    return memory_run(cls, case) if case["measure_memory"] else run_values(cls, case)


def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda case: run_alone(run_problem, fn, case, timeout=MEMORY_TIMEOUT_S,
                                                                   peaks=case["measure_memory"]))


def truth(case: dict) -> dict:
    """torch's SDPA in float64 on the scenario's inputs: o, dq, dk, dv (the memory scenario: its fingerprint)."""
    (q, k, v), upstream = make_inputs(case)
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=case["is_causal"])
    o.backward(upstream.double())
    if case["measure_memory"]:
        rows = slice(0, FINGERPRINT_ROWS)
        return {"output": compact(o[..., rows, :]), "dq": compact(q.grad[..., rows, :])}
    return {"output": compact(o), "dq": compact(q.grad), "dk": compact(k.grad), "dv": compact(v.grad)}


def observe_reference(fn, *, salt: int = 0) -> dict:
    """The reference's observation with each scenario's truth (torch's SDPA in float64)."""
    result = observe(fn, salt=salt)
    for s in result["scenarios"].values():
        s["truth"] = truth(s["case"])
    return result
