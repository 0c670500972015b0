"""Gates in the grader's own models: points of the backward pass where a rank stops to be measured (observing side).

``GradientGate()`` is an identity module. In backward, the gradient reaching it is reported to the launcher (a digest
of it: its sum and its sum of squares) and multiplied by the factor the launcher answers (``ranks.ask_gate``). So the
rank waits there while the launcher measures it (meter.py's gate policies), and the gradients of every layer before
the gate depend on having asked: ``reading.gate_digests`` divides the factors out again for the checks.
"""
import torch
from torch import nn

from .ranks import ask_gate

_paused = [True]


def pause_at_gates(enabled: bool) -> None:
    """Whether the gates stop the rank (a warm-up step can run through them without asking)."""
    _paused[0] = enabled


class _Gate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ask_gate("backward", grad) if _paused[0] else grad


class GradientGate(nn.Module):
    def forward(self, x):
        return _Gate.apply(x)


def grad_digests(model: nn.Module) -> list[list[float] | None]:
    """Each parameter's gradient as [sum, sum of squares] (float64): small enough to ship, enough to compare."""
    found = []
    for p in model.parameters():
        g = None if p.grad is None else p.grad.detach().double()
        found.append(None if g is None else [float(g.sum()), float(g.square().sum())])
    return found
