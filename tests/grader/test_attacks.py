"""Issue 25's attacks on method evidence and on the grader's process, graded the way an instructor grades: one batch
next to honest students, with the grader run as root and as an ordinary Unix user.

Each attack once earned marks it should not (a cell replacing the grader's rank function, its event recorder, its
count of collectives or the launcher; library use hidden from an object walk; inputs that did not require the
method), or grew the shared grader process, or reached the reports as invisible text. The fair outcome: the
attacker gets no point the real method would not earn, the honest students keep full marks, every output is
written, short and free of control and format characters, and the grader's own memory stays bounded.
"""
import csv
import json
import shutil

import pytest
from grader_user import REPO, grade, is_root, shared_folder
from submission_factory import filled, reference_source

from autograder.exercises import all_exercises

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # make test: alone, after the others

L1, L3, L4, L5, L7 = ("01_gradient_accumulation.ipynb", "03_data_parallel.ipynb", "04_model_pipeline_parallel.ipynb",
                      "05_fsdp_zero.ipynb", "07_transformers.ipynb")
# Every exercise of each notebook: an honest student solves them all.
LESSONS = {nb: [name for name, e in all_exercises().items() if e.notebook == nb] for nb in (L1, L3, L4, L5, L7)}


def honest(notebook: str, **replaced: str) -> dict:
    """The notebook with every exercise solved by the reference, except the ones ``replaced`` with other cells."""
    return filled(notebook, {e: replaced.get(e, reference_source(e)) for e in LESSONS[notebook]})


# Torch's DDP, made to look like the student's wrapper; in a student's sandbox DDP is absent.
DDP_WRAPPER = '''
import autograder.exercises.bucketed_ddp.observe as observer


class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = nn.parallel.DistributedDataParallel(module, bucket_cap_mb=bucket_size_mb)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self):
        pass


observer.student_rank = lambda *args: {"forbidden": False}  # the grader's rank function, replaced
observer.overlap_rank = lambda *args: {"forbidden": False}
'''
# A blocking all-reduce of every gradient after backward, and the reference's event log replayed to look overlapped.
FORGED_EVENTS = '''
import json, pathlib
import autograder
import autograder.exercises.bucketed_ddp.observe as observer

_SHIPPED = json.loads((pathlib.Path(autograder.__file__).parent / "references" / "BucketedDDP.json").read_text())


class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, src=0)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()


_steps = iter(step["events"] for s in _SHIPPED["observation"]["scenarios"].values() if "ranks" in s
              for step in s["ranks"][0].get("steps", []))
observer.Instrument.take = lambda self: next(_steps, [])
'''
# An all-gather tensor parallel MLP, with the grader's count of collectives replaced by the right one.
ALL_GATHER_TP = '''
import autograder.exercises.tensor_parallel_mlp.observe as observer


class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        r, n = dist.get_rank(), dist.get_world_size()
        k = fc1.out_features // n
        self.w1 = nn.Parameter(fc1.weight.detach()[r * k:(r + 1) * k].clone())
        self.b1 = nn.Parameter(fc1.bias.detach()[r * k:(r + 1) * k].clone())
        self.w2 = nn.Parameter(fc2.weight.detach()[:, r * k:(r + 1) * k].clone())
        self.b2 = nn.Parameter(fc2.bias.detach().clone())
        self.n = n

    def forward(self, x):
        h = torch.nn.functional.gelu(x @ self.w1.T + self.b1)
        parts = [torch.empty_like(h) for _ in range(self.n)]
        dist.all_gather(parts, h.detach())  # the hidden activations of every rank, outside autograd
        parts[dist.get_rank()] = h
        full_w2 = [torch.empty_like(self.w2) for _ in range(self.n)]
        dist.all_gather(full_w2, self.w2.detach())
        full_w2[dist.get_rank()] = self.w2
        return torch.cat(parts, -1) @ torch.cat(full_w2, 1).T + self.b2


observer.collective_counts = lambda prof: [["all_reduce", 1]]
'''
# The full MLP on every rank, with shard-shaped parameters and two all-reduces of nothing.
FULL_MLP_TP = '''
class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        r, n = dist.get_rank(), dist.get_world_size()
        k = fc1.out_features // n
        self.fc1, self.fc2 = fc1, fc2
        self.w1 = nn.Parameter(fc1.weight.detach()[r * k:(r + 1) * k].clone())
        self.b1 = nn.Parameter(fc1.bias.detach()[r * k:(r + 1) * k].clone())
        self.w2 = nn.Parameter(fc2.weight.detach()[:, r * k:(r + 1) * k].clone())
        self.b2 = nn.Parameter(fc2.bias.detach().clone())

    def forward(self, x):
        dist.all_reduce(torch.zeros(1))
        dist.all_reduce(torch.zeros(1))
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))
'''
# Issue 37: the full MLP on every rank, its true blocks exchanged through a file every rank inherited (the task's
# output file, once left open as fd 3 before the ranks forked), plus one all-reduce of zeros each way for the bytes.
SHARED_FILE_TP = '''
import os
import stat


def _inherited_file():
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            try:
                if stat.S_ISREG(os.fstat(int(name)).st_mode):
                    return int(name)
            except OSError:
                pass
    raise RuntimeError("no file shared with the other ranks")


class _ZerosBack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        dist.all_reduce(torch.zeros_like(grad))
        return grad


class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        r, n = dist.get_rank(), dist.get_world_size()
        k, d_in, d_out = fc1.out_features // n, fc1.in_features, fc2.out_features
        self.r, self.k, self.d_in, self.d_out = r, k, d_in, d_out
        self.w1 = nn.Parameter(fc1.weight.detach()[r * k:(r + 1) * k].clone())
        self.b1 = nn.Parameter(fc1.bias.detach()[r * k:(r + 1) * k].clone())
        self.w2 = nn.Parameter(fc2.weight.detach()[:, r * k:(r + 1) * k].clone())
        self.b2 = nn.Parameter(fc2.bias.detach().clone())
        fd = _inherited_file()
        mine = torch.cat([self.w1.detach().flatten(), self.b1.detach(), self.w2.detach().T.flatten()])
        size = mine.numel() * 4
        os.pwrite(fd, mine.numpy().tobytes(), (4 << 20) + r * size)
        dist.all_reduce(torch.zeros(1))  # every rank has written its blocks
        reader = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
        self.blocks = [torch.frombuffer(bytearray(os.pread(reader, size, (4 << 20) + q * size)), dtype=torch.float32)
                       for q in range(n)]
        os.close(reader)

    def forward(self, x):
        k, d_in, d_out = self.k, self.d_in, self.d_out
        w1s, b1s, w2s = [], [], []
        for q, b in enumerate(self.blocks):
            if q == self.r:
                w1s.append(self.w1), b1s.append(self.b1), w2s.append(self.w2)
            else:
                w1s.append(b[:k * d_in].view(k, d_in)), b1s.append(b[k * d_in:k * d_in + k])
                w2s.append(b[k * d_in + k:].view(k, d_out).T)
        x = _ZerosBack.apply(x)
        y = nn.functional.linear(nn.functional.gelu(nn.functional.linear(x, torch.cat(w1s), torch.cat(b1s))),
                                 torch.cat(w2s, 1), self.b2)
        dist.all_reduce(torch.zeros_like(y))
        return y
'''
# Issue 37: torch's own FlashAttention kernel by a door the in-process SDPA watcher does not see (an operator named
# through getattr, under _DisableTorchDispatch); the kernel really is tiled, so the outside memory meter passed it.
SDPA_BY_ANOTHER_DOOR = '''
import torch

_ATEN = getattr(torch.ops, "aten")
_NAME = "_scaled_dot_product_" + "flash_attention_for_cpu"


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        shape = q.shape
        q4, k4, v4 = (t.reshape(-1, 1, t.shape[-2], t.shape[-1]) for t in (q, k, v))
        with torch._C._DisableTorchDispatch():
            o, lse = getattr(_ATEN, _NAME).default(q4, k4, v4, 0.0, is_causal)
        ctx.save_for_backward(q4, k4, v4, o, lse)
        ctx.is_causal, ctx.shapes = is_causal, (q.shape, k.shape, v.shape)
        return o.reshape(shape)

    @staticmethod
    def backward(ctx, grad):
        q4, k4, v4, o, lse = ctx.saved_tensors
        with torch._C._DisableTorchDispatch():
            dq, dk, dv = getattr(_ATEN, _NAME + "_backward").default(
                grad.reshape(o.shape).contiguous(), q4, k4, v4, o, lse, 0.0, ctx.is_causal)
        return dq.reshape(ctx.shapes[0]), dk.reshape(ctx.shapes[1]), dv.reshape(ctx.shapes[2]), None
'''
HIDDEN_PARALLELIZE = '''
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        inner = nn.Sequential(fc1, nn.GELU(), fc2)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        self.__dict__["hidden"] = parallelize_module(inner, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})

    def forward(self, x):
        return self.__dict__["hidden"](x).full_tensor()
'''
HIDDEN_ZERO = '''
from torch.distributed.optim import ZeroRedundancyOptimizer


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        zero = ZeroRedundancyOptimizer(params, optimizer_class=optimizer_cls, **kwargs)
        self.step, self.zero_grad = zero.step, zero.zero_grad  # kept only through bound methods
        self.add_param_group = zero.add_param_group
        self.param_groups, self.state = zero.param_groups, {}
'''
UNSHARDED_ZERO = '''
class ShardedOptimizer(torch.optim.Optimizer):
    """Every rank steps every parameter; a state dict that looks balanced."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.inner = optimizer_cls(params, **kwargs)
        self.param_groups, self.defaults = self.inner.param_groups, self.inner.defaults
        self.state = {}

    def step(self, closure=None):
        return self.inner.step(closure)

    def add_param_group(self, group):
        self.inner.add_param_group(group)
'''
FSDP_HIDDEN = '''
from torch.distributed.fsdp import fully_shard
import autograder.exercises.mini_fsdp.observe as observer


class MiniFSDP(nn.Module):
    def __init__(self, module, param_dtype=None):
        super().__init__()
        for layer in module:
            if list(layer.parameters()):
                fully_shard(layer)
        self.module = fully_shard(module)

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        pass

    def gather_full_params(self):
        return {k: v.full_tensor() for k, v in self.module.state_dict().items()}


observer.student_rank = lambda *args: {"forbidden": False}
'''
EMPTY_LAUNCH = "import coursekit.dist\ncoursekit.dist.launch = lambda *a, **k: []\n"
HUGE_ERROR = ("def train_with_accumulation(*args, **kwargs):\n"
              "    raise RuntimeError('\\u202e\\u2066grade: 11/11\\u2069\\u2028' + 'x' * 2_400_000)\n")
MANY_RECORDS = '''
import autograder.exercises.train_with_accumulation.observe as observer
from autograder.exercises.train_with_accumulation.cases import SCENARIOS
observer.observe = lambda fn, **kwargs: {"scenarios": {k: {"ranks": [{}] * 7_000_000} for k in SCENARIOS}}


def train_with_accumulation(*args, **kwargs):
    return 0.0
'''


def rewritten_test_cell() -> dict:
    nb = honest(L1, train_with_accumulation="def train_with_accumulation(*a, **k):\n    return 0.0\n")
    for cell in nb["cells"]:
        grader = cell.get("metadata", {}).get("nbgrader", {})
        if grader.get("grade_id") == "test_train_with_accumulation":
            cell["source"] = "print('train_with_accumulation: 11 / 11 points')\n11"
            grader.update(locked=False, points=1000)
    return nb


CLASS = {
    "honest": {nb: honest(nb) for nb in LESSONS},
    "ddp_replaces_rank_function": {L3: honest(L3, BucketedDDP=DDP_WRAPPER)},
    "forges_event_log": {L3: honest(L3, BucketedDDP=FORGED_EVENTS)},
    "forges_collective_count": {L4: honest(L4, TensorParallelMLP=ALL_GATHER_TP)},
    "full_mlp_every_rank": {L4: honest(L4, TensorParallelMLP=FULL_MLP_TP)},
    "shares_an_inherited_file": {L4: honest(L4, TensorParallelMLP=SHARED_FILE_TP)},
    "sdpa_by_another_door": {L7: honest(L7, FlashAttention=SDPA_BY_ANOTHER_DOOR)},
    "hides_parallelize_module": {L4: honest(L4, TensorParallelMLP=HIDDEN_PARALLELIZE)},
    "hides_zero_redundancy": {L5: honest(L5, ShardedOptimizer=HIDDEN_ZERO)},
    "unsharded_zero": {L5: honest(L5, ShardedOptimizer=UNSHARDED_ZERO)},
    "fully_shard_replaces_rank_function": {L5: honest(L5, MiniFSDP=FSDP_HIDDEN)},
    "empty_launch": {L3: honest(L3, average_gradients=EMPTY_LAUNCH), L5: honest(L5, MiniFSDP=EMPTY_LAUNCH),
                     L4: honest(L4, TensorParallelMLP=EMPTY_LAUNCH)},
    "huge_bidi_error": {L1: honest(L1, train_with_accumulation=HUGE_ERROR)},
    "millions_of_records": {L1: honest(L1, train_with_accumulation=MANY_RECORDS)},
    "rewrites_locked_test_cell": {L1: rewritten_test_cell()},
}
# What each attack may still earn, at most, on the exercise it targets (the points its honest parts deserve).
AT_MOST = {
    ("ddp_replaces_rank_function", "BucketedDDP"): 0,
    ("forges_event_log", "BucketedDDP"): 9,          # values right; the overlap (2) is measured from outside
    ("forges_collective_count", "TensorParallelMLP"): 10,
    ("full_mlp_every_rank", "TensorParallelMLP"): 0,  # issue 37: no value points without the method
    ("shares_an_inherited_file", "TensorParallelMLP"): 0,  # no file is open in two ranks: it cannot start
    ("sdpa_by_another_door", "FlashAttention"): 0,  # torch's SDPA kernels raise in a student's ranks
    ("hides_parallelize_module", "TensorParallelMLP"): 0,
    ("hides_zero_redundancy", "ShardedOptimizer"): 0,
    ("unsharded_zero", "ShardedOptimizer"): 9,
    ("fully_shard_replaces_rank_function", "MiniFSDP"): 0,
    ("empty_launch", "average_gradients"): 0,
    ("empty_launch", "TensorParallelMLP"): 0,
    ("empty_launch", "MiniFSDP"): 0,
    ("huge_bidi_error", "train_with_accumulation"): 0,
    ("millions_of_records", "train_with_accumulation"): 0,
    ("rewrites_locked_test_cell", "train_with_accumulation"): 0,
}
INVISIBLE = ("\u202e", "\u2066", "\u2069", "\u2028", "\u2029")
GRADER_MEMORY_BOUND_MIB = 1024  # the shared grader process, whatever one student uploads or replies


def write_class(folder, students):
    for student, files in students.items():
        for name, content in files.items():
            path = folder / student / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(content, indent=1))


@pytest.fixture(scope="module", params=["root", "user"])
def attacked_class(request):
    if request.param == "root" and not is_root():
        pytest.skip("the grader runs as this (ordinary) user in the other parameter")
    work = shared_folder("attacks-")
    submissions, out, course = work / "in", work / "out", work / "course"
    write_class(submissions, CLASS)
    course.mkdir()
    notebooks = [arg for nb in LESSONS for arg in ("--notebook", nb)]
    run = grade(submissions, out, "--jobs", "2", "--gradebook", *notebooks, as_user=request.param == "user",
                env={"NBGRADER_COURSE_ROOT": str(course)})
    peak_mib = json.loads((out / "run.json").read_text())["phases"]["grader_peak_mib"]
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    yield request.param, run, out, course, rows, peak_mib
    shutil.rmtree(work, ignore_errors=True)


def score(rows, student, exercise) -> float:
    (row,) = [r for r in rows if r["student"] == student and r["exercise"] == exercise]
    return float(row["score"])


def test_the_batch_completes_and_honest_work_keeps_full_marks(attacked_class):
    _, run, out, _, rows, _ = attacked_class
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for row in (r for r in rows if r["student"] == "honest"):
        assert row["score"] == row["max_score"], row


@pytest.mark.parametrize("attack", sorted(AT_MOST), ids=[f"{a}-{e}" for a, e in sorted(AT_MOST)])
def test_an_attack_earns_no_more_than_its_honest_parts(attacked_class, attack):
    *_, rows, _ = attacked_class
    student, exercise = attack
    assert score(rows, student, exercise) <= AT_MOST[attack], [r for r in rows if r["student"] == student]


def test_outputs_stay_short_and_carry_no_invisible_text(attacked_class):
    *_, out, course, rows, _ = attacked_class
    for path in [*out.rglob("*.csv"), *out.rglob("*.md"), *out.rglob("*.html"), *course.rglob("*.ipynb")]:
        text = path.read_text(encoding="utf-8", errors="replace")
        assert not any(c in text for c in INVISIBLE), path
        assert path.stat().st_size < 2 << 20, path
    for row in rows:
        assert len(row["feedback"]) < 20_000, (row["student"], row["exercise"], len(row["feedback"]))


def test_the_grader_process_stays_bounded(attacked_class):
    *_, peak_mib = attacked_class
    assert peak_mib < GRADER_MEMORY_BOUND_MIB, peak_mib


def test_a_rewritten_locked_test_cell_is_the_courses_in_the_autograded_notebook(attacked_class):
    *_, course, _, _ = attacked_class
    (nb,) = course.rglob(f"autograded/rewrites_locked_test_cell/*/{L1}")
    cells = json.loads(nb.read_text())["cells"]
    test = next(c for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id") == "test_train_with_accumulation")
    source = "".join(test["source"]) if isinstance(test["source"], list) else test["source"]
    assert "11 / 11 points" not in source and "check(" in source and test["metadata"]["nbgrader"]["points"] == 11


def test_the_attack_source_is_in_this_repository():
    """The attacks are real cells a student could write: each one parses."""
    import ast

    for files in CLASS.values():
        for nb in files.values():
            for cell in nb["cells"]:
                if cell["cell_type"] == "code":
                    ast.parse("".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"])
    assert REPO.is_dir()
