"""coursekit.kernels: Lesson 10's Triton helpers, each checked by what it does (Triton's private interpreter API
included: these tests fail when a Triton upgrade moves it)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from coursekit import kernels
from coursekit.kernels import (
    _interpreter_builder,
    count_traffic,
    eager_traffic,
    roofline_seconds,
    saved_for_backward,
    traffic_of,
    triton_mode,
)

MODE = triton_mode()  # before the kernel below is decorated
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


def test_without_a_gpu_the_interpreter_is_chosen_before_kernels_are_defined():
    if torch.cuda.is_available():
        assert MODE == "compiled"
    else:
        assert MODE == "interpreted" and os.environ["TRITON_INTERPRET"] == "1"


def test_a_missing_triton_is_said(monkeypatch):
    monkeypatch.setattr(kernels.importlib.util, "find_spec", lambda name: None)
    assert triton_mode() == "missing"


def test_traffic_counts_only_the_lanes_each_programs_mask_enables():
    x, y, out = torch.randn(1000), torch.randn(1000), torch.empty(1000)
    traffic = traffic_of(add_kernel, (4,), x, y, out, 1000, BLOCK=256)
    assert traffic.programs == [(p, 0, 0) for p in range(4)]
    assert traffic.loaded[(3, 0, 0)] == 2 * (1000 - 768) * 4 and traffic.stored[(3, 0, 0)] == (1000 - 768) * 4
    assert traffic.bytes == 3 * 1000 * 4 and all(traffic.loads[p] == 2 for p in traffic.programs)


def test_counting_leaves_the_interpreter_as_it_was():
    builder = _interpreter_builder()
    with count_traffic():
        pass
    assert "create_masked_load" not in vars(builder) and "create_masked_store" not in vars(builder)


def test_a_kernel_defined_for_the_gpu_is_counted_in_the_interpreter(tmp_path):
    """On a GPU machine the kernels are compiled; traffic_of still runs them through the interpreter."""
    script = textwrap.dedent("""
        import torch, triton, triton.language as tl
        from coursekit.kernels import traffic_of

        @triton.jit
        def copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)

        assert not type(copy).__name__.startswith("Interpreted")
        x, out = torch.arange(10.0), torch.zeros(10)
        print(traffic_of(copy, (2,), x, out, 10, BLOCK=8).bytes)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    (tmp_path / "compiled.py").write_text(script)  # Triton reads a kernel's source from its file
    done = subprocess.run([sys.executable, str(tmp_path / "compiled.py")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == str(2 * 10 * 4)


def test_a_gpu_kernel_that_reduces_runs_in_the_interpreter_after_triton_was_imported_for_the_compiler(tmp_path):
    """tl.sum calls a helper Triton made for the compiler when it was imported without TRITON_INTERPRET (as
    ``import torch._dynamo`` does, e.g. in the class grader's worker); interpreted() still runs the kernel, and
    again with the helpers' language modules left patched (coursekit.kernels skips re-patching them)."""
    script = textwrap.dedent("""
        import torch._dynamo, triton, triton.language as tl
        from coursekit.kernels import interpreted

        @triton.jit
        def total(x_ptr, out_ptr, BLOCK: tl.constexpr):
            tl.store(out_ptr, tl.sum(tl.load(x_ptr + tl.arange(0, BLOCK)), axis=0))

        @triton.jit
        def largest(x_ptr, out_ptr, BLOCK: tl.constexpr):
            tl.store(out_ptr, tl.max(tl.load(x_ptr + tl.arange(0, BLOCK)), axis=0))

        out, found = torch.zeros(1), []
        for kernel in (total, largest, total, largest):  # helpers called again once the language is patched
            interpreted(kernel)[(1,)](torch.arange(8.0), out, BLOCK=8)
            found.append(out.item())
        print(tl.core.is_builtin(tl.add), *found)  # each kernel's run leaves triton.language as it found it
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    (tmp_path / "reduce.py").write_text(script)
    done = subprocess.run([sys.executable, str(tmp_path / "reduce.py")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-5:] == ["True", "28.0", "7.0", "28.0", "7.0"], done.stdout


def test_eager_traffic_counts_inputs_read_and_outputs_written():
    x, y = torch.randn(10), torch.randn(10)
    assert eager_traffic(lambda: x + y) == 3 * 10 * 4


def test_saved_for_backward_counts_each_storage_once():
    x = torch.randn(8, 4, requires_grad=True)
    assert saved_for_backward(lambda: x * x) == [((8, 4), "float32", 8 * 4 * 4)]
    w = torch.randn(4, requires_grad=True)
    assert sorted(nbytes for _, _, nbytes in saved_for_backward(lambda: x * w)) == [4 * 4, 8 * 4 * 4]


def test_roofline_names_the_bound():
    seconds, bound = roofline_seconds("NVIDIA H100 80GB HBM3", 3.35e12, 1.0)
    assert bound == "memory" and seconds == pytest.approx(1.0)
    seconds, bound = roofline_seconds("NVIDIA H100 80GB HBM3", 1.0, 989e12)
    assert bound == "compute" and seconds == pytest.approx(1.0)


@triton.jit
def add_without_mask(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))


def test_lanes_outside_every_tensor_are_counted_per_program():
    """What a GPU refuses (an illegal memory access) and the interpreter quietly reads: the last block's lanes
    past n, three accesses of 1024 - 1000 lanes each, all in the last program."""
    x, y, out = torch.randn(1000), torch.randn(1000), torch.empty(1000)
    assert sum(traffic_of(add_kernel, (4,), x, y, out, 1000, BLOCK=256).outside.values()) == 0
    unmasked = traffic_of(add_without_mask, (4,), torch.randn(1024)[:1000], torch.randn(1024)[:1000],
                          torch.empty(1024)[:1000], 1000, BLOCK=256)  # views: the lanes past n stay in memory
    assert dict(+unmasked.outside) == {(3, 0, 0): 3 * 24}
