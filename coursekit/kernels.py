"""Triton kernels on any machine (Lesson 10): the interpreter where there is no GPU, and what a kernel moved.

Triton's interpreter (``TRITON_INTERPRET=1``) runs a ``@triton.jit`` function as NumPy, one program after another:
the same code a GPU compiles, slow by design, so that it can be run, stepped through and tested on a laptop. It
decides when a kernel is decorated, so ``triton_mode()`` must run before the lesson's kernels are defined.

Running in the interpreter also lets the course *count* what a kernel does: every ``tl.load`` and ``tl.store``
goes through one object of the interpreter, so ``count_traffic()`` sees the bytes each program moved (only the
lanes its mask enables), and any enabled lane that addresses memory outside every tensor the kernel was given: on
a GPU such a load or store is an illegal memory access (or reads a neighbour's bytes), while the interpreter reads
whatever lies there without a word. That object is private to Triton: it is reached here only, through
``_interpreter_builder()`` (tests/coursekit/test_kernels.py). PyTorch's unfused operators are counted the same way by a
dispatch mode (``eager_traffic``): each operator reads its inputs and writes its outputs once.
"""
import importlib.util
import os
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from coursekit.flops import DATASHEET_PEAK_16BIT

# Peak memory bandwidth (HBM) from NVIDIA's datasheets, bytes/s; the most specific name first.
DATASHEET_BANDWIDTH = [("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12), ("A100", 2.04e12)]
TRITON_PIN = "triton==3.7.1"  # the version torch 2.13.0's CUDA wheels require


def triton_mode() -> str:
    """"compiled" (a CUDA GPU), "interpreted" (no GPU: sets TRITON_INTERPRET=1) or "missing" (not installed)."""
    if importlib.util.find_spec("triton") is None:
        return "missing"
    if torch.cuda.is_available():
        return "compiled"
    os.environ["TRITON_INTERPRET"] = "1"  # read when a kernel is decorated: before the lesson's kernels
    return "interpreted"


def _interpreter_builder():
    """Triton's interpreter object that performs every load and store (private to Triton 3.x)."""
    from triton.runtime.interpreter import interpreter_builder
    return interpreter_builder


def interpreted(kernel):
    """The interpreter's version of a ``@triton.jit`` kernel, on any machine (its class is private to Triton 3.x)."""
    from triton.runtime.interpreter import InterpretedFunction
    _interpret_library_calls()
    return kernel if isinstance(kernel, InterpretedFunction) else InterpretedFunction(kernel.fn)


def _interpret_library_calls() -> None:
    """Triton's own ``@jit`` helpers (the combine functions behind ``tl.sum``, ``tl.max``...) are made when triton is
    imported: for the compiler, unless TRITON_INTERPRET was set by then (``import torch._dynamo`` imports triton).
    An interpreted kernel calls them from Python, which a compiled-mode helper refuses ("Cannot call @triton.jit'd
    outside of the scope of a kernel"). That call is never valid in compiled mode, so it is sent to the interpreter.
    (``JITFunction`` and ``InterpretedFunction`` are private to Triton 3.x; tests/coursekit/test_kernels.py.)"""
    from triton.runtime.interpreter import InterpretedFunction, InterpreterError
    from triton.runtime.jit import JITFunction

    if getattr(JITFunction.__call__, "interprets", False):
        return
    helpers = {}

    def call(self, *args, **kwargs):
        if self.fn not in helpers:
            helpers[self.fn] = InterpretedFunction(self.fn)
        if not _language_patched(self.fn):
            return helpers[self.fn](*args, **kwargs)
        # What InterpretedFunction.__call__ does once its language modules are patched: re-patching them (a scan of
        # every member of triton.language, a third of an interpreted kernel's time) would change nothing.
        try:
            return helpers[self.fn].rewrite()(*args, **kwargs)
        except Exception as e:
            raise InterpreterError(repr(e)) from e

    call.interprets = True
    JITFunction.__call__ = call


def _language_patched(fn) -> bool:
    """Whether the ``triton.language`` modules ``fn`` sees are the interpreter's already (its builtins replaced, as the
    running kernel's patch or an earlier helper call left them; private to Triton 3.x's interpreter)."""
    import triton.language as tl

    langs = [value for value in fn.__globals__.values() if value is tl or value is tl.core]
    return bool(langs) and not any(tl.core.is_builtin(getattr(lang, "add", None)) for lang in langs)


@dataclass
class Traffic:
    """Bytes each program (its grid index) loaded and stored, and how many loads it issued."""
    loaded: Counter = field(default_factory=Counter)
    stored: Counter = field(default_factory=Counter)
    loads: Counter = field(default_factory=Counter)
    outside: Counter = field(default_factory=Counter)  # enabled lanes addressing no tensor of the launch

    @property
    def bytes(self) -> int:
        return sum(self.loaded.values()) + sum(self.stored.values())

    @property
    def programs(self) -> list:
        return sorted(set(self.loaded) | set(self.stored))


def _element_bytes(handle) -> int:
    return handle.get_element_ty().primitive_bitwidth // 8


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The addresses [start, end) a tensor's elements occupy (a view: its own elements, not its whole storage)."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else -1
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _outside(ptrs, mask, spans) -> int:
    """How many enabled lanes of a load or store address memory in none of ``spans``."""
    addresses, width = ptrs.data[mask.data].astype("int64"), _element_bytes(ptrs)
    inside = addresses < 0  # all False
    for start, end in spans:
        inside |= (addresses >= start) & (addresses + width <= end)
    return int((~inside).sum())


@contextmanager
def count_traffic(tensors=()):
    """Count the bytes every interpreted ``tl.load``/``tl.store`` moves inside the block, per program, and (given
    the launch's ``tensors``) the enabled lanes that address none of them."""
    builder = _interpreter_builder()
    traffic = Traffic()
    load, store = builder.create_masked_load, builder.create_masked_store
    spans = [_span(t) for t in tensors]

    def counted_load(ptrs, mask, *args):
        program = tuple(builder.grid_idx)
        traffic.loaded[program] += int(mask.data.sum()) * _element_bytes(ptrs)
        traffic.loads[program] += 1
        traffic.outside[program] += _outside(ptrs, mask, spans) if spans else 0
        return load(ptrs, mask, *args)

    def counted_store(ptrs, value, mask, *args):
        program = tuple(builder.grid_idx)
        traffic.stored[program] += int(mask.data.sum()) * _element_bytes(ptrs)
        traffic.outside[program] += _outside(ptrs, mask, spans) if spans else 0
        return store(ptrs, value, mask, *args)

    builder.create_masked_load, builder.create_masked_store = counted_load, counted_store
    try:
        yield traffic
    finally:
        del builder.create_masked_load, builder.create_masked_store  # the class's methods again


def traffic_of(kernel, grid, *args, **meta) -> Traffic:
    """Launch ``kernel[grid](*args, **meta)`` in the interpreter on CPU copies of its tensors and count its
    traffic: the same numbers with or without a GPU (``outside``: lanes that would fault on a GPU)."""
    args = [a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args]
    with count_traffic([a for a in args if isinstance(a, torch.Tensor)]) as traffic:
        interpreted(kernel)[grid](*args, **meta)
    return traffic


class _Reads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        flat = [*args, *(kwargs or {}).values(), *(result if isinstance(result, (tuple, list)) else (result,))]
        self.bytes += sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))
        return result


def eager_traffic(fn) -> int:
    """Bytes PyTorch's operators read and write while ``fn()`` runs: each reads its inputs, writes its outputs.

    (A view reads nothing in truth; unfused element-wise code has few of them.) TorchDispatchMode is private to
    torch (``torch.utils._python_dispatch``)."""
    mode = _Reads()
    with mode:
        fn()
    return mode.bytes


def saved_for_backward(fn) -> list[tuple[tuple, str, int]]:
    """What autograd keeps for the backward while ``fn()`` builds its graph: (shape, dtype, bytes) per distinct
    storage (a tensor saved twice counts once)."""
    seen, saved = set(), []

    def pack(t):
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            saved.append((tuple(t.shape), str(t.dtype).removeprefix("torch."), t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return saved


def roofline_seconds(gpu: str, moved_bytes: float, flops: float) -> tuple[float, str]:
    """The least time a kernel can take on ``gpu`` by its datasheet (16-bit peak, HBM bandwidth), and the bound."""
    bandwidth = next(b for name, b in DATASHEET_BANDWIDTH if name in gpu)
    peak = next(p for name, p in DATASHEET_PEAK_16BIT if name in gpu)
    memory_s, compute_s = moved_bytes / bandwidth, flops / peak
    return max(memory_s, compute_s), ("memory" if memory_s >= compute_s else "compute")
