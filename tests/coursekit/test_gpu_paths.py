"""The GPU paths of the course, checked on a CPU: what would break on a machine with GPUs, caught here.

* A notebook's kernel must not initialise CUDA before it forks NCCL ranks ("Cannot re-initialize CUDA in forked
  subprocess"): the start page is run with two faked GPUs and must never touch CUDA, and no lesson calls a
  CUDA-initialising function at top level before its last ``launch``.
* Under NCCL a collective takes tensors on the rank's GPU: every tensor a rank function (or an exercise's
  reference) creates names its device, or is moved there at once.
* The capstone's checkpoint carries the GPU's random generator too (dropout on a GPU draws from it).
* Lesson 3 reads overlap on a GPU from the device's kernels, not from CPU-side launch times.
* The MiniFSDP reference uses the collectives torch 2.13 does not deprecate (no FutureWarning on stderr).
"""
import ast
import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

import coursekit.dist
from coursekit.profiling import backward_overlap

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "solutions").rglob("*.ipynb"))
SCRIPTS = [REPO / "solutions/lesson6/capstone.py", REPO / "solutions/lesson3/ddp_train.py"]
FACTORIES = {"tensor", "zeros", "ones", "empty", "full", "randn", "rand", "randint", "arange", "linspace", "eye"}
LAUNCHERS = {"launch", "launch_with_progress", "run_on_ranks"}


def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


# ---- 1. the start page with two (faked) GPUs -------------------------------------------------------------

def test_start_page_never_initialises_cuda_before_its_nccl_ranks(monkeypatch, capsys):
    touched = []

    def cuda_initialised(*args, **kwargs):
        touched.append("torch.cuda._lazy_init")
        raise AssertionError("the kernel initialised CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "_lazy_init", cuda_initialised)  # get_device_name, set_device, tensors: all go here
    real_launch = coursekit.dist.launch
    launched = []

    def launch(fn, world_size=2, *args, **kwargs):
        assert not touched, "CUDA was initialised in the kernel before launch()"
        launched.append(coursekit.dist.backend_for(world_size))
        return real_launch(fn, world_size, *args, backend="gloo", **kwargs)  # the ranks themselves run on the CPU here

    monkeypatch.setattr(coursekit.dist, "launch", launch)
    namespace = {"__name__": "__main__"}
    for cell in code_cells(REPO / "solutions/00-start-here.ipynb"):
        text = source(cell)
        if "show_run_times" in text:
            continue
        exec(compile(text, "start page", "exec"), namespace)
    assert launched == ["nccl"], "with two GPUs the start page must launch NCCL ranks"
    assert not touched and "✓" in capsys.readouterr().out


# ---- 2. tensors made in rank code are on the rank's device -----------------------------------------------

def _functions(tree: ast.AST) -> dict[str, ast.AST]:
    return {node.name: node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def _called_names(node: ast.AST) -> set[str]:
    return {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def _deviceless_factories(node: ast.AST, where: str) -> list[str]:
    parents = {child: parent for parent in ast.walk(node) for child in ast.iter_child_nodes(parent)}
    found = []
    for call in ast.walk(node):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in FACTORIES
                and isinstance(call.func.value, ast.Name) and call.func.value.id == "torch"):
            continue
        if any(k.arg == "device" for k in call.keywords):
            continue
        parent = parents.get(call)  # torch.randn(...).to(dev): moved at once
        if isinstance(parent, ast.Attribute) and parent.attr in ("to", "cuda") and isinstance(parents.get(parent), ast.Call):
            continue
        found.append(f"{where}: {ast.unparse(call)[:80]} (line {call.lineno})")
    return found


def rank_code(path: Path) -> tuple[dict[str, ast.AST], set[str]]:
    """A notebook's functions and classes, and the names of those that run in ranks: launched ones (not on an
    explicit gloo backend), the exercises' solution cells, and whatever they call that the notebook defines."""
    cells = code_cells(path)
    trees = [ast.parse(source(c)) for c in cells]
    defined = {name: node for tree in trees for name, node in _functions(tree).items()}
    in_ranks = set()
    for cell, tree in zip(cells, trees):
        if cell["metadata"].get("nbgrader", {}).get("solution"):
            in_ranks |= set(_functions(tree))
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            if isinstance(call.func, ast.Name) and call.func.id in LAUNCHERS and call.args:
                on_gloo = any(k.arg == "backend" and isinstance(k.value, ast.Constant) and k.value.value == "gloo"
                              for k in call.keywords)
                if isinstance(call.args[0], ast.Name) and not on_gloo:
                    in_ranks.add(call.args[0].id)
    changed = True
    while changed:
        changed = False
        for name in list(in_ranks):
            for called in _called_names(defined[name]) if name in defined else ():
                if called in defined and called not in in_ranks:
                    in_ranks.add(called)
                    changed = True
    return defined, in_ranks


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_rank_code_creates_tensors_on_the_rank_device(path):
    defined, in_ranks = rank_code(path)
    found = [f for name in sorted(in_ranks & set(defined)) for f in _deviceless_factories(defined[name], name)]
    assert not found, f"{path.stem}: tensors made in rank code without a device (NCCL would reject them):\n" + \
        "\n".join(found)


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_scripts_create_tensors_on_the_rank_device(path):
    found = _deviceless_factories(ast.parse(path.read_text()), path.name)
    assert not found, "\n".join(found)


def test_the_checker_sees_a_cpu_tensor_in_a_rank():
    tree = ast.parse("def f(rank, n):\n    t = torch.tensor([1.0])\n    u = torch.ones(2, device=d)\n"
                     "    v = torch.randn(3).to(d)\n")
    assert len(_deviceless_factories(tree, "f")) == 1


# ---- 3. no CUDA in a kernel before its last launch ------------------------------------------------------

CUDA_IN_THE_KERNEL = ("pick_device(", ".cuda(", "torch.cuda.synchronize", "torch.cuda.set_device",
                      "torch.cuda.get_device_name", "torch.cuda.memory", "torch.cuda.max_memory", 'device="cuda"')


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_cuda_work_in_the_kernel_before_its_last_launch(path):
    cells = code_cells(path)
    launching = [i for i, c in enumerate(cells) if any(f"{name}(" in source(c) for name in LAUNCHERS)]
    if not launching:
        return
    problems = []
    for i, cell in enumerate(cells[:launching[-1] + 1]):
        for node in ast.parse(source(cell)).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue  # bodies run in the ranks
            text = ast.unparse(node)
            problems += [f"code cell {i}: {text[:100]}" for marker in CUDA_IN_THE_KERNEL if marker in text]
            if "describe_device(" in text and "describe_device('cpu')" not in text:
                problems.append(f"code cell {i}: describe_device of a CUDA device initialises CUDA: {text[:100]}")
    assert not problems, f"{path.stem}: CUDA work in the kernel before a later launch():\n" + "\n".join(problems)


# ---- 4. the capstone's checkpoint carries the GPU's generator -------------------------------------------

def test_capstone_saves_and_restores_the_cuda_generator(monkeypatch):
    import sys

    sys.path.insert(0, str(REPO / "solutions/lesson6"))
    try:
        import capstone
    finally:
        sys.path.pop(0)
    gpu_state, restored = torch.arange(16, dtype=torch.uint8), []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=None: gpu_state.clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device=None: restored.append((state, device)))
    gpu = torch.device("cuda", 1)
    state = capstone.rng_state(gpu)
    assert torch.equal(state["cuda"], gpu_state) and torch.equal(state["cpu"], torch.get_rng_state())
    capstone.set_rng_state(state, gpu)
    assert len(restored) == 1 and torch.equal(restored[0][0], gpu_state) and restored[0][1] == gpu
    assert set(capstone.rng_state(torch.device("cpu"))) == {"cpu"}
    text = (REPO / "solutions/lesson6/capstone.py").read_text()
    assert "rng_state(my_device())" in text and "set_rng_state(state[\"rng\"]" in text, \
        "save_checkpoint and load_checkpoint must use rng_state / set_rng_state"


# ---- 5. overlap on a GPU from the device's kernels ------------------------------------------------------

def _event(name, start, end, device=DeviceType.CPU, thread=1):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), device_type=device,
                           thread=thread, is_user_annotation=device == DeviceType.CUDA and name == "backward")


def test_overlap_on_a_gpu_comes_from_device_kernels_not_launch_times():
    """The CPU launches the backward's kernels in 0-100 µs and is done; the GPU runs them 50-2000 µs, and NCCL's
    all-reduce 900-1500 µs: all of it hidden behind the backward. CPU-side times would say: none of it."""
    cuda = DeviceType.CUDA
    events = [_event("backward", 0, 100),
              _event("autograd::engine::evaluate_function: AddmmBackward0", 0, 40),
              _event("autograd::engine::evaluate_function: AddmmBackward0", 40, 100),
              _event("backward", 50, 2000, cuda),  # the annotation, drawn on the GPU timeline
              _event("ampere_sgemm_128x64_nn", 50, 1000, cuda), _event("ampere_sgemm_128x64_tn", 1000, 2000, cuda),
              _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 900, 1500, cuda)]
    found = backward_overlap(events)
    assert found["backward ms"] == pytest.approx(1.95)
    assert found["comm"] == [pytest.approx((0.85, 1.45))]
    assert found["compute"] == [pytest.approx((0.0, 1.95))]


def test_overlap_on_a_cpu_comes_from_autograd_and_gloo_threads():
    events = [_event("autograd::engine::evaluate_function: AddmmBackward0", 0, 400),
              _event("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 400, 500),
              _event("gloo:all_reduce", 300, 700, thread=2)]
    found = backward_overlap(events)
    assert found["backward ms"] == pytest.approx(0.4) and found["comm"] == [pytest.approx((0.3, 0.7))]


# ---- 6. MiniFSDP's reference: no deprecated collectives --------------------------------------------------

def _minifsdp_step(rank, world_size):
    import warnings

    from autograder.authoring.course import reference_function

    warnings.simplefilter("error")  # a FutureWarning in a rank would be red text in the notebook
    torch.manual_seed(0)
    model = reference_function("MiniFSDP")(torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(),
                                                                torch.nn.Linear(5, 3)))
    model(torch.randn(2, 4)).sum().backward()
    model.finish_gradient_synchronization()
    return sorted(model.gather_full_params())


def test_minifsdp_reference_warns_about_nothing():
    from autograder.authoring.course import reference_function

    reference_function("MiniFSDP")  # defined once here, inherited by the forked ranks
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ranks = coursekit.dist.launch(_minifsdp_step, 2, backend="gloo", timeout=60)
    assert ranks[0] == ["0.bias", "0.weight", "2.bias", "2.weight"]
