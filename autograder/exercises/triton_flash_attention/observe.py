"""Observing ``TritonFlashAttention``: the grader launches the student's kernel itself, and calls their Function.

How the grader launches them (guarded buffers, a process per scenario, the interpreter): ``kernel_launch``.
"""
import math
from functools import partial

import torch

from ..beside.kernel_launch import GuardedBuffer, alone, compact, student_kernels, students_own_errors
from ..beside.observing import observation
from .cases import GUARD, SENTINEL, cases

KERNEL = "flash_fwd_kernel"  # the name the exercise fixes
Guarded = partial(GuardedBuffer, guard=GUARD, sentinel=SENTINEL)  # this exercise's guard sizes


def make_inputs(case: dict) -> dict:
    """Seeded q, k, v and the upstream gradient do, (heads, n, d) for a kernel launch, the case's shape for the
    Function, in the scenario's dtype."""
    g = torch.Generator().manual_seed(case["seed"])
    shape = tuple(case["shape"]) if "shape" in case else (case["heads"], case["n"], case["d"])
    dtype = getattr(torch, case["dtype"])
    # q twice as large: scores spread over a few units, so a later key tile often raises a row's maximum
    tensors = {"q": 2 * torch.randn(*shape, generator=g)}
    tensors.update((name, torch.randn(*shape, generator=g)) for name in ("k", "v", "do"))
    return {name: t.to(dtype) for name, t in tensors.items()}


def launch(kernel, q, k, v, case: dict, programs: int | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One launch of the kernel on the grader's grid (``programs`` query tiles, else all of them) in guarded
    buffers: o, L and which guards are intact."""
    heads, n, d = q.shape
    guarded = {"q": Guarded(q), "k": Guarded(k), "v": Guarded(v), "o": Guarded(q, output=True),
               "L": Guarded(torch.zeros(heads, n), output=True)}
    grid = (programs or math.ceil(n / case["block_m"]), heads)
    kernel[grid](*(guarded[name].tensor for name in ("q", "k", "v", "o", "L")), n, 1 / math.sqrt(d),
                 D=d, BLOCK_M=case["block_m"], BLOCK_N=case["block_n"], CAUSAL=case["causal"])
    return guarded["o"].tensor, guarded["L"].tensor, {name: g.intact() for name, g in guarded.items()}


def launch_tiles(kernel, q, k, v, case: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """One causal launch per query tile i, on the grid of tiles 0..i, with every key past tile i's last row NaN:
    a kernel that loads a key tile past the diagonal gets NaN into that tile's o. Tile i's rows are kept."""
    n, block_m = q.shape[1], case["block_m"]
    o, L, guards = torch.empty_like(q), torch.empty(q.shape[:2]), {}
    for i in range(math.ceil(n / block_m)):
        rows = slice(i * block_m, min((i + 1) * block_m, n))
        hidden_k, hidden_v = k.clone(), v.clone()
        hidden_k[:, rows.stop:], hidden_v[:, rows.stop:] = float("nan"), float("nan")
        tile_o, tile_L, intact = launch(kernel, q, hidden_k, hidden_v, case, programs=i + 1)
        o[:, rows], L[:, rows] = tile_o[:, rows], tile_L[:, rows]
        guards = {name: guards.get(name, True) and ok for name, ok in intact.items()}
    return o, L, guards


def call_function(cls, inputs: dict, kernel) -> dict:
    """The student's Function through autograd, its kernel swapped for the interpreted one (this process only)."""
    cls.forward.__globals__[KERNEL] = kernel
    torch.use_deterministic_algorithms(True)  # with it torch.empty fills with NaN: rows never written read the same
    q, k, v = (Guarded(inputs[n]).tensor.requires_grad_() for n in ("q", "k", "v"))
    o = cls.apply(q, k, v, True)
    if not isinstance(o, torch.Tensor) or o.shape != q.shape:
        got = f"shape {tuple(o.shape)}" if isinstance(o, torch.Tensor) else type(o).__name__
        raise ValueError(f"TritonFlashAttention.apply returned {got}, not o shaped like q {tuple(q.shape)}")
    o.backward(Guarded(inputs["do"]).tensor)
    missing = [name for name, t in (("dq", q), ("dk", k), ("dv", v)) if t.grad is None]
    if missing:
        raise ValueError(f"backward left {', '.join(missing)} as None: return (dq, dk, dv, None)")
    return {"o": compact(o), "dq": compact(q.grad), "dk": compact(k.grad), "dv": compact(v.grad)}


def run_problem(rank: int, world_size: int, cls, case: dict) -> dict:
    """One scenario, in a process of its own."""
    kernel, inputs = student_kernels(cls, (KERNEL,))[KERNEL], make_inputs(case)
    with students_own_errors():
        if case["launch"] == "function":
            return call_function(cls, inputs, kernel)
        run = launch_tiles if case["launch"] == "tiles" else launch
        o, L, guards = run(kernel, inputs["q"], inputs["k"], inputs["v"], case)
    return {"o": compact(o), "L": compact(L), "guards": guards}


def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda case: alone(run_problem, fn, case))


def scores(q, k, scale: float, causal: bool, strict: bool = False) -> torch.Tensor:
    """q kᵀ·scale in float64, keys after each query (``strict``: from the query itself on) at -inf when causal."""
    s = q.double() @ k.double().transpose(-1, -2) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(0 if strict else 1), -math.inf)
    return s


def without_rescale(s, v, block_n: int) -> torch.Tensor:
    """o of an online softmax whose running output is never rescaled when the maximum grows (float64): what
    the kernel computes with that mistake, tile by tile."""
    acc, total, m = 0, 0, torch.full(s.shape[:-1], -math.inf, dtype=torch.float64)
    for start in range(0, s.shape[-1], block_n):
        tile = s[..., start:start + block_n]
        new = torch.maximum(m, tile.max(-1).values)
        p = torch.exp(tile - new[..., None])
        total = total * torch.exp(m - new) + p.sum(-1)
        acc, m = acc + p @ v.double()[..., start:start + block_n, :], new
    return acc / total[..., None]


def truth(case: dict) -> dict:
    """Attention in float64 on the scenario's inputs, and for the catalogue what its known mistakes compute."""
    inputs = make_inputs(case)
    q, k, v = (inputs[n].double() for n in ("q", "k", "v"))
    scale = 1 / math.sqrt(case["d"])
    if case["launch"] == "function":
        q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
        o = torch.softmax(scores(q, k, scale, True), -1) @ v
        o.backward(inputs["do"].double())
        return {"o": compact(o), "dq": compact(q.grad), "dk": compact(k.grad), "dv": compact(v.grad)}
    s = scores(q, k, scale, case["causal"])
    found = {"o": compact(torch.softmax(s, -1) @ v), "L": compact(torch.logsumexp(s, -1))}
    if case["launch"] == "kernel" and not case["causal"]:
        found["alternatives"] = {"L_scale_twice": compact(torch.logsumexp(s * scale, -1)),
                                 "L_without_max": compact(torch.logsumexp(s, -1) - s.max(-1).values),
                                 "o_without_rescale": compact(without_rescale(s, v, case["block_n"]))}
    elif case["launch"] == "kernel":
        strict = scores(q, k, scale, True, strict=True)[:, 1:]   # query 0 has no key before it
        found["alternatives"] = {"L_strict_from_row_1": compact(torch.logsumexp(strict, -1))}
    return found


def observe_reference(fn, *, salt: int = 0) -> dict:
    """The reference's observation with each scenario's truth (float64)."""
    result = observe(fn, salt=salt)
    for s in result["scenarios"].values():
        s["truth"] = truth(s["case"])
    return result
