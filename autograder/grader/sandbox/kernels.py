"""torch kernels an exercise forbids, switched off in the dispatcher of a student's rank (issue 37).

A forbidden *library* is a Python file, and the sandbox binds a stub over it (forbidden.py). A forbidden *kernel*
(FlashAttention's rule: no torch SDPA) is an ATen operator, reachable by many doors: ``F.scaled_dot_product_attention``,
``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`` by a name built with ``getattr``, under
``torch._C._DisableTorchDispatch()`` where no Python-level watcher sees it. Every door ends in the dispatcher, so
each rank of a student's task registers, before any submitted code, a kernel that raises for each forbidden operator
and dispatch key, and keeps the registration alive with no Python reference to it (``gc`` cannot find it, so no
cell can deregister it). The reference's worker keeps the kernels (its ground truths use SDPA).

``torch._C._dispatch_library`` is private torch API: it stays behind ``switch_off``, which
tests/sandbox/test_sandbox_defences.py checks on the installed torch. What remains: a cell that scans its own process's
memory with ctypes for the registration, or tiles through ``torch.compile`` (flex attention); the class report's
audit lists cells that reach into ``torch._C``.
"""
import ctypes
import os

MESSAGE = ("torch's {name} is switched off in the grader's sandbox: this exercise asks you to write the attention "
           "yourself")


def switch_off(operators: tuple[tuple[str, str], ...]) -> None:
    """Each ``(operator, dispatch key)`` of ``aten`` raises from now on in this process and the processes it forks."""
    if not operators:
        return
    import torch

    module = torch._C._dispatch_library("IMPL", "aten", "")
    for name, key in operators:
        def refuse(*args, _name=name, **kwargs):
            raise RuntimeError(MESSAGE.format(name=_name))

        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)  # "Overriding a previously registered kernel": a warning on a notebook's stderr scores 0
        try:
            module.impl(name, key, refuse)
        finally:
            os.dup2(saved, 2)
            os.close(saved), os.close(null)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(module))  # alive for good, and reachable from nowhere
    del module
