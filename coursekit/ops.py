"""Which operators a piece of code really ran, and the largest tensor any of them made.

Activation recomputation is invisible in a plain profile of the backward (its forward ops run inside it), and
selective checkpointing dispatches the ops it saved without running them again, which the profiler still records.
A dispatch mode sees each operator that reaches a kernel exactly once, in the forward and in the backward, at a
fraction of the profiler's cost. ``TorchDispatchMode`` lives in a private module of torch
(``torch.utils._python_dispatch``), so the course uses it only here (tests/coursekit/test_lesson7_helpers.py).
"""
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass
class OpsSeen:
    counts: Counter = field(default_factory=Counter)  # aten operator name ("addmm", "gelu", …) -> calls
    largest: int = 0                                   # elements of the largest tensor an operator returned


class _Watching(TorchDispatchMode):
    def __init__(self, seen: OpsSeen):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        self.seen.counts[func.overloadpacket.__name__] += 1
        for t in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(t, torch.Tensor):
                self.seen.largest = max(self.seen.largest, t.numel())
        return result


def watch_ops(fn) -> OpsSeen:
    """Run ``fn()`` (its backward passes included) and return the operators that ran and the largest output."""
    seen = OpsSeen()
    with _Watching(seen):
        fn()
    return seen


def count_ops(fn) -> Counter:
    """Run ``fn()`` and return how often each aten operator ran, by name (``"addmm"``, ``"gelu"``, …)."""
    return watch_ops(fn).counts
