"""The grader's side of a Triton exercise: it launches the student's kernels itself, with its own grid and blocks.

Every buffer it passes sits inside a larger one (``GuardedBuffer``), so a read or write past the end shows in the
values; every scenario runs in a process of its own (``alone``): a kernel that writes past a buffer may corrupt that
process's heap, which then costs only its scenario. Kernels always run in Triton's interpreter on the CPU
(``coursekit.kernels.interpreted``), whether the student's notebook compiled them for a GPU or not, so the same
launch gives the same values on every machine.
"""
import importlib
from contextlib import contextmanager

import torch

from ..judging.checking import ABORTED, DEADLOCK
from .ranks import run_on_ranks

# What Triton imports at a kernel's first launch in a process (the types of its arguments, gluon's among them; the
# code generator; libdevice): about 45 ms of CPU in every scenario's process. Imported with this module instead,
# which the grading worker's zygote imports once for every task (an absent Triton: the cells say so themselves).
FIRST_LAUNCH_IMPORTS = ("triton.experimental.gluon", "triton.compiler.code_generator", "triton.language.extra.libdevice")
for _name in FIRST_LAUNCH_IMPORTS:
    try:
        importlib.import_module(_name)
    except ImportError:
        pass

TIMEOUT_S = 30.0  # a correct scenario takes well under a second in the interpreter
CRASHED = "the process crashed, its memory corrupted (as by a tl.store past the end of a tensor)"


def compact(t: torch.Tensor) -> list[float]:
    """A tensor as a flat list of floats with 6 significant digits (NaN and inf kept)."""
    return [float(f"{v:.6g}") for v in t.detach().double().flatten().tolist()]


class GuardedBuffer:
    """A tensor in the middle of a larger buffer: GUARD elements on each side hold NaN (an input: a read past the
    end pollutes the result) or SENTINEL (an output, filled with it too: an element never written shows)."""

    def __init__(self, value: torch.Tensor, *, guard: int, sentinel: float, output: bool = False):
        n = value.numel()
        self.buffer = torch.full((2 * guard + n,), sentinel if output else float("nan"), dtype=value.dtype)
        self.tensor = self.buffer[guard:guard + n].view(value.shape)
        self.tensor.copy_(torch.full_like(value, sentinel) if output else value)
        self.guard, self.sentinel, self.output = guard, sentinel, output

    def intact(self) -> bool:
        outside = torch.cat([self.buffer[:self.guard], self.buffer[-self.guard:]])
        return bool((outside == self.sentinel).all() if self.output else outside.isnan().all())


def student_kernels(cls, names: tuple[str, ...]) -> dict:
    """The student's kernels, from the namespace their Function was defined in, as interpreted kernels."""
    from coursekit.kernels import interpreted

    namespace = getattr(getattr(cls, "forward", None), "__globals__", None) or {}
    for name in names:
        if not hasattr(namespace.get(name), "fn"):
            raise NameError(f"no @triton.jit kernel named {name} next to {getattr(cls, '__name__', 'your Function')}")
    return {name: interpreted(namespace[name]) for name in names}


@contextmanager
def students_own_errors():
    """Triton's interpreter wraps an exception raised inside a kernel in its InterpreterError: re-raise the
    student's own (the blank kernel's NotImplementedError, an IndexError...), so that the feedback names it."""
    try:
        yield
    except Exception as exc:
        if type(exc).__name__ == "InterpreterError" and isinstance(exc.__cause__, Exception):
            raise exc.__cause__ from None
        raise


def crash_words(error: str) -> str:
    """The launcher's error for a process that did not finish, in this exercise's words."""
    if error == ABORTED:
        return f"SIGABRT: {CRASHED}"
    if error == DEADLOCK:
        return f"TimeoutError: it ran longer than the grader's {TIMEOUT_S:.0f} s (an endless loop?)"
    if "died without a result" in error:
        return f"{error.partition('(signal ')[2].rstrip(')') or 'a signal'}: {CRASHED}"
    return error


def alone(run_problem, fn, case: dict) -> dict:
    """``run_problem(rank, world_size, fn, case)`` in a process of its own, quiet: a heap a missing mask corrupted makes
    glibc abort with a message on stderr, which would cost a notebook's test cell its score."""
    found = run_on_ranks(run_problem, 1, fn, case, timeout=TIMEOUT_S, group=False, quiet=True)
    if "error" in found:  # the launcher's words are a rank's (gloo, collectives): this process has none
        return {"error": crash_words(str(found["error"]))}
    return {**found["ranks"][0], "meter": found["meter"]}
