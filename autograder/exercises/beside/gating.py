"""Gates in the grader's own code: points where a rank stops to be measured, and whose answers the next part of
the computation needs (observing side).

``GradientGate()`` is an identity module. In backward, the gradient reaching it is reported to the launcher (a digest
of it: its sum and its sum of squares) and multiplied element by element by factors in [0.5, 1.5) drawn from the
seed the launcher answers (``ranks.ask_gate``). So the rank waits there while the launcher measures it (meter.py's
gate policies), and the gradient reaching the next gate exists only once this one was answered and the layer between
them ran backward with those factors: no throw-away pass can compute it ahead. ``replay`` recomputes, in the
launcher, the digests a rank's gates must report under the seeds it was given (``GatePolicy.expect``).

Where a reading comes between steps or passes rather than inside a backward pass, the same holds through the data:
``step_seed`` mixes the gate's answer into the seed of what the rank computes next (the next step's gradients, the
backward's incoming gradient), and the launcher recomputes what each gate must report from the seeds it answered.
"""
import torch
from torch import nn

from .ranks import ask_gate, digest

_paused = [True]
_replaying: list[tuple[list[int], list[list[float]]]] = []  # (seeds, digests) while ``replay`` runs


def pause_at_gates(enabled: bool) -> None:
    """Whether the gates stop the rank (a warm-up step can run through them without asking)."""
    _paused[0] = enabled


def step_seed(seed: int, answer: float | None) -> int:
    """The seed of the data computed after a gate: the scenario's ``seed`` mixed with the launcher's ``answer`` there
    (drawn after the fork: nothing in a rank predicts it), so what the next gate reads exists only once this one was
    answered. ``seed`` itself where the scenario has no gates (``ask_gate`` answered None)."""
    return int(seed) if answer is None else (int(seed) * 1_000_003 + int(answer)) % (1 << 62)


def factors(seed: int, grad: torch.Tensor) -> torch.Tensor:
    """The per-element factors a gate answered with ``seed`` multiplies the gradient by."""
    generator = torch.Generator().manual_seed(int(seed))
    return torch.rand(grad.shape, generator=generator, dtype=grad.dtype).add_(0.5).to(grad.device)


class _Gate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if _replaying:
            seeds, digests = _replaying[-1]
            digests.append(digest(grad))
            seed = seeds[len(digests) - 1] if len(digests) <= len(seeds) else None
        else:
            seed = ask_gate("backward", grad) if _paused[0] else None
        return grad if seed is None else grad * factors(seed, grad)


class GradientGate(nn.Module):
    def forward(self, x):
        return _Gate.apply(x)


def replay(run, seeds: list[int]) -> list[list[float]]:
    """The digests the gates report while ``run()`` goes through a gated model's backward in this process, each
    gate answered with the next of ``seeds`` (the launcher's recomputation of a rank's gates; see ``in_launcher``)."""
    digests: list[list[float]] = []
    _replaying.append((seeds, digests))
    try:
        run()
    finally:
        _replaying.pop()
    return digests


def in_launcher(compute):
    """``compute`` as the launching process runs it (``GatePolicy.expect``): on one thread (several, on a loaded
    machine, spin against each other, and ranks forked later need an idle pool), with its random state untouched
    (a student's kernel, in a self-check) and autograd on."""
    def run(*args):
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.random.fork_rng(devices=[]), torch.enable_grad():
                return compute(*args)
        finally:
            torch.set_num_threads(threads)
    return run


def grad_digests(model: nn.Module) -> list[list[float] | None]:
    """Each parameter's gradient as [sum, sum of squares] (float64): small enough to ship, enough to compare."""
    return [None if p.grad is None else digest(p.grad) for p in model.parameters()]
