"""Observing ``FusedLayerNorm``: the grader launches the student's kernels itself, and calls their Function.

How the grader launches them (guarded buffers, a process per scenario, the interpreter): ``kernel_launch``.
"""
from functools import partial

import torch
import torch.nn.functional as F

from ..beside.kernel_launch import GuardedBuffer, alone, compact, student_kernels, students_own_errors
from ..beside.observing import observation
from .cases import EPS, GUARD, SENTINEL, cases

FORWARD, BACKWARD = "layer_norm_fwd_kernel", "layer_norm_bwd_kernel"  # the names the exercise fixes
Guarded = partial(GuardedBuffer, guard=GUARD, sentinel=SENTINEL)  # this exercise's guard sizes


def make_inputs(case: dict) -> dict:
    """Seeded x, w, b and the upstream gradient dy, in the scenario's dtype."""
    g = torch.Generator().manual_seed(case["seed"])
    shape = (*case["lead"], case["cols"]) if "lead" in case else (case["rows"], case["cols"])
    dtype = getattr(torch, case["dtype"])
    x = case["mean"] + torch.randn(*shape, generator=g)
    w = 1 + 0.5 * torch.randn(case["cols"], generator=g)
    b = 0.5 * torch.randn(case["cols"], generator=g)
    dy = torch.randn(*shape, generator=g)
    return {name: t.to(dtype) for name, t in (("x", x), ("w", w), ("b", b), ("dy", dy))}


def statistics(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's mean and 1/sqrt(variance + eps), in float64 (the biased variance, as LayerNorm's)."""
    x = x.double()
    mean = x.mean(-1)
    return mean, (x.var(-1, unbiased=False) + EPS).rsqrt()


def launch_forward(kernel, inputs: dict, case: dict) -> dict:
    rows, cols = case["rows"], case["cols"]
    x, w, b = (Guarded(inputs[n]) for n in ("x", "w", "b"))
    y = Guarded(inputs["x"], output=True)
    mean, rstd = (Guarded(torch.zeros(rows), output=True) for _ in range(2))
    kernel[(rows,)](x.tensor, w.tensor, b.tensor, y.tensor, mean.tensor, rstd.tensor, cols, EPS, BLOCK=case["block"])
    return {"y": compact(y.tensor), "mean": compact(mean.tensor), "rstd": compact(rstd.tensor),
            "guards": {"x": x.intact(), "w": w.intact(), "b": b.intact(), "y": y.intact(), "mean": mean.intact(),
                       "rstd": rstd.intact()}}


def launch_backward(kernel, inputs: dict, case: dict) -> dict:
    """The backward kernel, given the true statistics (float32), so that its values do not depend on the forward's."""
    rows, cols = case["rows"], case["cols"]
    true_mean, true_rstd = statistics(inputs["x"])
    dy, x, w, mean, rstd = (Guarded(t) for t in (inputs["dy"], inputs["x"], inputs["w"], true_mean.float(),
                                                  true_rstd.float()))
    dx = Guarded(inputs["x"], output=True)
    dw, db = (Guarded(torch.zeros(rows, cols), output=True) for _ in range(2))
    kernel[(rows,)](dy.tensor, x.tensor, w.tensor, mean.tensor, rstd.tensor, dx.tensor, dw.tensor, db.tensor, cols,
                    BLOCK=case["block"])
    return {"dx": compact(dx.tensor), "dw": compact(dw.tensor), "db": compact(db.tensor),
            "guards": {"dy": dy.intact(), "x": x.intact(), "w": w.intact(), "mean": mean.intact(),
                       "rstd": rstd.intact(), "dx": dx.intact(), "dw": dw.intact(), "db": db.intact()}}


def call_function(cls, inputs: dict, kernels: dict) -> dict:
    """The student's Function through autograd, its kernels swapped for interpreted ones (this process only)."""
    cls.forward.__globals__.update(kernels)
    torch.use_deterministic_algorithms(True)  # with it torch.empty fills with NaN: rows never written read the same
    x, w, b = (Guarded(inputs[n]).tensor.requires_grad_() for n in ("x", "w", "b"))
    y = cls.apply(x, w, b)
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        got = f"shape {tuple(y.shape)}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(f"FusedLayerNorm.apply returned {got}, not y shaped like x {tuple(x.shape)}")
    y.backward(Guarded(inputs["dy"]).tensor)
    missing = [name for name, t in (("dx", x), ("dw", w), ("db", b)) if t.grad is None]
    if missing:
        raise ValueError(f"backward left {', '.join(missing)} as None: return (dx, dw, db, None)")
    return {"y": compact(y), "dx": compact(x.grad), "dw": compact(w.grad), "db": compact(b.grad)}


def run_problem(rank: int, world_size: int, cls, case: dict) -> dict:
    """One scenario, in a process of its own."""
    kernels, inputs = student_kernels(cls, (FORWARD, BACKWARD)), make_inputs(case)
    if case["launch"] == "function":
        with students_own_errors():
            return call_function(cls, inputs, kernels)
    found = {}
    for which, kernel, launch in (("forward", FORWARD, launch_forward), ("backward", BACKWARD, launch_backward)):
        if case["launch"] in (which, "kernels"):
            with students_own_errors():
                result = launch(kernels[kernel], inputs, case)
            found = {**found, **result, "guards": {**found.get("guards", {}),
                                                   **{f"{which} {k}": v for k, v in result["guards"].items()}}}
    return found


def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda case: alone(run_problem, fn, case))


def truth(case: dict) -> dict:
    """LayerNorm in float64 on the scenario's inputs: what each launch must produce."""
    inputs = make_inputs(case)
    x, w, b, dy = (inputs[n].double() for n in ("x", "w", "b", "dy"))
    if case["launch"] == "function":
        x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
        y = F.layer_norm(x, (case["cols"],), w, b, eps=EPS)
        y.backward(dy)
        return {"y": compact(y), "dx": compact(x.grad), "dw": compact(w.grad), "db": compact(b.grad)}
    mean, rstd = statistics(inputs["x"])
    found = {}
    if case["launch"] in ("forward", "kernels"):
        y = (x - mean[:, None]) * rstd[:, None] * w + b
        found.update(y=compact(y), mean=compact(mean), rstd=compact(rstd))
    if case["launch"] in ("backward", "kernels"):
        mean, rstd = mean.float().double(), rstd.float().double()  # what the grader gave the kernel
        x_hat, g = (x - mean[:, None]) * rstd[:, None], dy * w
        dx = rstd[:, None] * (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True))
        found.update(dx=compact(dx), dw=compact(dy * x_hat), db=compact(dy))
    return found


def observe_reference(fn, *, salt: int = 0) -> dict:
    """The reference's observation with each scenario's truth (float64)."""
    result = observe(fn, salt=salt)
    for s in result["scenarios"].values():
        s["truth"] = truth(s["case"])
    return result
