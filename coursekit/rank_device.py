"""NCCL's device rule on gloo ranks: a collective refuses a tensor made without the rank's device.

Under NCCL every tensor a collective moves must live on the rank's GPU; gloo moves CPU tensors, and on a CPU the
rank's device *is* the CPU, so rank code that makes a buffer with ``torch.empty(n)`` (no ``device=``) runs here and
fails on the first GPU it meets. ``off_device_refused()``, in a rank, tracks the tensors made without a device
(factory functions called without ``device=``, and everything computed from them until ``.to(device)`` moves them),
and makes the collectives of ``torch.distributed`` raise ``WouldFailUnderNCCL`` on them. It only ever refuses a
tensor that was visibly made on the host; one it cannot trace passes: torch runs the code autograd calls (an
autograd Function's backward, gradient hooks) outside Python's function modes, so a buffer made there is not seen.
"""
import contextlib
import functools
import weakref

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d
from torch.overrides import TorchFunctionMode

NCCL_DEVICE = "would fail under NCCL"
FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint, torch.arange,
             torch.tensor, torch.eye, torch.linspace, torch.empty_strided}
MOVES = {torch.Tensor.to, torch.Tensor.cuda}
COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "broadcast", "all_gather", "all_gather_coalesced",
               "all_gather_into_tensor", "all_gather_single", "reduce_scatter", "reduce_scatter_single",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "reduce", "gather", "scatter", "send",
               "recv", "isend", "irecv", "batch_isend_irecv")  # the object collectives place their tensors themselves


class WouldFailUnderNCCL(RuntimeError):
    """A collective given a tensor that lives in host memory, not on the rank's device."""


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, dist.P2POp):
        yield value.tensor


class HostTensors:
    """Tensors known to live in host memory, by identity (a ``WeakSet`` would compare tensors with ``==``)."""

    def __init__(self):
        self._refs: dict[int, weakref.ref] = {}

    def __contains__(self, tensor) -> bool:
        ref = self._refs.get(id(tensor))
        return ref is not None and ref() is tensor

    def add(self, tensor) -> None:
        key = id(tensor)
        self._refs[key] = weakref.ref(tensor, lambda _: self._refs.pop(key, None))  # forgotten when it dies

    def discard(self, tensor) -> None:
        if tensor in self:
            del self._refs[id(tensor)]


class _HostTensors(TorchFunctionMode):
    """Remembers the tensors made on the host: made without ``device=``, or computed from one such."""

    def __init__(self):
        super().__init__()
        self.host = HostTensors()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in FACTORIES:
            on_host = kwargs.get("device") is None
        elif func in MOVES:
            on_host = not (kwargs.get("device") is not None or func is torch.Tensor.cuda
                           or any(isinstance(a, torch.device | str) for a in args[1:])) and args[0] in self.host
        elif getattr(func, "__name__", "").endswith("_"):
            return out  # in place: the tensor stays where it was (a copy_ from the host into a device tensor is fine)
        else:
            on_host = any(t in self.host for t in _tensors((args, kwargs)))
        for tensor in _tensors(out):
            (self.host.add if on_host else self.host.discard)(tensor)
        return out


def _refusing(name: str, collective, host: HostTensors):
    @functools.wraps(collective)
    def checked(*args, **kwargs):
        if any(t in host for t in _tensors((args, kwargs))):
            raise WouldFailUnderNCCL(
                f"{NCCL_DEVICE}: dist.{name} was given a tensor made without a device (torch.empty(...) and the like "
                "make it in host memory), and NCCL moves only tensors on the rank's GPU. Make it with "
                "device=... (the rank's device, or the device of the tensor it goes with) or move it with .to(device).")
        return collective(*args, **kwargs)
    return checked


@contextlib.contextmanager
def off_device_refused():
    """In a rank: inside the block, collectives refuse tensors made without the rank's device (see above)."""
    mode = _HostTensors()
    saved = {name: getattr(dist, name) for name in COLLECTIVES}
    checked = {name: _refusing(name, collective, mode.host) for name, collective in saved.items()}
    # P2POp accepts only the isend and irecv its own module names: the checked ones there too
    c10d = {name: getattr(distributed_c10d, name) for name in ("isend", "irecv")}
    for name in saved:
        setattr(dist, name, checked[name])
    for name in c10d:
        setattr(distributed_c10d, name, checked[name])
    try:
        with mode:
            yield
    finally:
        for name, collective in saved.items():
            setattr(dist, name, collective)
        for name, collective in c10d.items():
            setattr(distributed_c10d, name, collective)
