"""GPU semantics on a CPU: what would go wrong under NCCL and CUDA, shown by gloo ranks and by the lessons' text.

* Point-to-point order (``coursekit.gpu_semantics``): with ``launch(..., strict=True)`` a send waits for its
  receive, as under NCCL with large messages; a ring of blocking send-then-receive raises "would hang under NCCL" at
  once (plain gloo hangs there too, until the launch times out), the orders that work on GPUs run.
* Bytes on the wire are counted the same whatever the back end calls its records (``nccl:send 0->1``,
  ``nccl:coalesced`` for a batch): ``coursekit.multidim``.
* One back end for a whole comparison: on a machine with fewer GPUs than a lesson's largest launch, every launch
  of that lesson runs on gloo (Lesson 8 with 2 faked GPUs).
* Determinism claims: a lesson that says results are bitwise equal, in a notebook running an operation whose CUDA
  kernels torch documents as non-deterministic, says the claim is the CPU's.
* The device rule (``coursekit.rank_device``): under ``strict=True`` a collective refuses a tensor made without the
  rank's device (``torch.empty(n)`` works on gloo and fails on the first GPU); MiniFSDP's reference passes (it
  found the grader's own gradient norm summed on the host), and its gather buffer made with ``torch.empty(n)``
  instead of ``shard.new_empty`` (the kind of defect it once had) is caught.
* Triton kernels touch only their tensors (``coursekit.kernels``): a lane outside every tensor of its launch is an
  illegal memory access on a GPU and a silent read in the interpreter; Lesson 10's kernels are run at sizes their
  blocks do not divide, and the fused cross-entropy without its vocabulary mask is caught.
"""
import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import coursekit.dist
from coursekit.dist import RankFailed, launch
from coursekit.gpu_semantics import NCCL_HANG, nccl_p2p_order, own_store
from coursekit.kernels import count_traffic, interpreted, triton_mode
from coursekit.multidim import SentBytes, bytes_sent, record_kind

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "solutions").rglob("*.ipynb"))


# ---- 1. sends that wait for their receive ---------------------------------------------------------------

def _ring(rank, world_size, order):
    torch.manual_seed(rank)
    device = coursekit.dist.my_device()  # on the rank's device, as NCCL needs (the device rule of section 5)
    held, arriving = torch.randn(64, device=device) + rank, torch.empty(64, device=device)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for _ in range(world_size - 1):
        if order == "blocking send, then recv":
            dist.send(held, right)
            dist.recv(arriving, left)
        elif order == "even ranks send first":
            first, second = ((dist.send, held, right), (dist.recv, arriving, left))[::1 if rank % 2 == 0 else -1]
            first[0](first[1], first[2])
            second[0](second[1], second[2])
        elif order == "isend, irecv, wait":
            works = [dist.isend(held, right), dist.irecv(arriving, left)]
            [w.wait() for w in works]
        else:
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, held, right), dist.P2POp(dist.irecv, arriving, left)])
            [w.wait() for w in works]
        held, arriving = arriving, held
    return held.mean().round().item()


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_ring_of_blocking_sends_would_hang_under_nccl(world_size):
    with pytest.raises(RankFailed, match=NCCL_HANG):
        launch(_ring, world_size, "blocking send, then recv", backend="gloo", strict=True, timeout=30)


@pytest.mark.parametrize("order", ["even ranks send first", "isend, irecv, wait", "batch_isend_irecv"])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_the_orders_that_work_under_nccl_run_in_strict_mode(order, world_size):
    got = launch(_ring, world_size, order, backend="gloo", strict=True, timeout=30)
    assert got == [float((r + 1) % world_size) for r in range(world_size)]  # each rank holds its right neighbour's


def _ring_then_plain_sends(rank, world_size):
    with nccl_p2p_order():
        _ring(rank, world_size, "batch_isend_irecv")
    return _ring(rank, world_size, "even ranks send first")  # after the block: the process group's own methods


def test_sends_work_as_before_after_the_strict_block():
    assert launch(_ring_then_plain_sends, 2, backend="gloo", timeout=30) == [1.0, 0.0]


def _store_key(rank, world_size):
    own_store().set(f"from {rank}", "x")
    dist.barrier()
    seen = own_store().get(f"from {1 - rank}").decode()
    dist.barrier()  # rank 0 hosts the store: it stays until the other rank has read (else that one's connect waits)
    return seen


def test_a_rank_reaches_the_launch_store_on_a_connection_of_its_own():
    assert launch(_store_key, 2, backend="gloo", timeout=30) == ["x", "x"]


# ---- 2. bytes sent, whatever the back end calls its records ---------------------------------------------

def _events(*records):
    return SimpleNamespace(events=lambda: [SimpleNamespace(name=n, input_shapes=s) for n, s in records])


def test_record_names_of_every_back_end():
    assert [record_kind(n) for n in ("gloo:send", "nccl:send 0->1", "nccl:recv 1<-0", "nccl:coalesced",
                                     "nccl:all_to_all", "c10d::send", "aten::mm")] == \
        ["send", "send", "recv", "coalesced", "all_to_all", None, None]


def test_nccl_sends_are_counted_and_a_batch_without_sizes_is_not_counted_as_zero():
    nccl = _events(("nccl:send 0->1", [[2, 8, 16]]), ("nccl:recv 0<-3", [[2, 8, 16]]), ("nccl:all_to_all", [[4, 16]]))
    assert bytes_sent(nccl, 4) == 4 * 2 * 8 * 16 + 4 * 4 * 16 * 3 // 4
    assert bytes_sent(_events(("gloo:send", [[2, 8, 16]])), 4) == 4 * 2 * 8 * 16
    with pytest.raises(ValueError, match="coalesced"):
        bytes_sent(_events(("nccl:coalesced", [])), 4)


def _sent_by_a_batched_ring(rank, world_size):
    held, arriving = torch.ones(2, 8, 16), torch.empty(2, 8, 16)
    with SentBytes() as sent:
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, held, (rank + 1) % world_size),
                                        dist.P2POp(dist.irecv, arriving, (rank - 1) % world_size)])
        [w.wait() for w in works]
        dist.all_to_all_single(torch.empty(8, 4), torch.ones(8, 4))
        dist.all_reduce(torch.ones(100))  # not counted
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, held, (rank + 1) % world_size),  # the methods restored
                                    dist.P2POp(dist.irecv, arriving, (rank - 1) % world_size)])
    [w.wait() for w in works]
    dist.all_to_all_single(torch.empty(8, 4), torch.ones(8, 4))
    return sent.bytes


def test_sent_bytes_counts_a_batched_ring_and_the_all_to_all_part_that_leaves():
    assert launch(_sent_by_a_batched_ring, 2, backend="gloo", timeout=30) == [4 * 2 * 8 * 16 + 4 * 4 * 4] * 2


# ---- 3. one back end for a whole comparison --------------------------------------------------------------

def _launches(path: Path) -> list[ast.Call]:
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    return [n for c in cells for n in ast.walk(ast.parse("".join(c["source"])))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "launch"]


def _launches_over_sizes(path: Path) -> list[str]:
    """Launches inside a loop over world sizes (``for t in (2, 4): launch(fn, t)``) that name no back end."""
    found = []
    for cell in (c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"):
        tree = ast.parse("".join(cell["source"]))
        loop_names = {n.id for loop in ast.walk(tree) if isinstance(loop, (ast.For, ast.comprehension))
                      for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
        found += [ast.unparse(c)[:80] for c in ast.walk(tree)
                  if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "launch"
                  and len(c.args) > 1 and isinstance(c.args[1], ast.Name) and c.args[1].id in loop_names
                  and not any(k.arg == "backend" for k in c.keywords)]
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_comparison_over_world_sizes_names_one_back_end(path):
    """backend_for(n) picks NCCL for n ranks when there are n GPUs: on a 2-GPU machine t = 2 would run on GPUs and
    t = 4 on the CPU, in one plot. Launches looping over world sizes pass one backend to all of them."""
    found = _launches_over_sizes(path)
    assert not found, f"{path.stem}: launches over several world sizes without one named back end: {found}"


def test_lesson8_with_two_gpus_runs_every_launch_on_gloo(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    path = REPO / "solutions/lesson8/08_multidim_parallel.ipynb"
    namespace = {}
    for cell in [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"][:2]:
        exec("".join(cell["source"]), namespace)
    assert namespace["BACKEND"] == "gloo" and coursekit.dist.backend_for(2) == "nccl"
    assert all(ast.unparse(k.value) == "BACKEND" for c in _launches(path) for k in c.keywords if k.arg == "backend")
    assert all(any(k.arg == "backend" for k in c.keywords) for c in _launches(path))


# ---- 4. determinism claims against torch's list of CUDA non-deterministic operations -------------------

# torch.use_deterministic_algorithms documents these as non-deterministic on CUDA (their backward, mostly);
# SDPA's memory-efficient and flash kernels have a non-deterministic backward (torch.nn.attention docs).
NONDETERMINISTIC_ON_CUDA = ("scaled_dot_product_attention", "index_add", "scatter_add", "index_put", "put_(",
                            "embedding_bag", "EmbeddingBag", "ctc_loss", "interpolate", "AdaptiveAvgPool",
                            "AvgPool3d", "MaxPool3d", "bincount", "histc", "cumsum", "coursekit.transformer")
BITWISE = re.compile(r"\bbitwise\b|\bbit[- ]for[- ]bit\b", re.IGNORECASE)
NEGATED = re.compile(r"\bnot\b[^.]{0,30}(bitwise|bit[- ]for[- ]bit)", re.IGNORECASE)


def bitwise_claims_without_cpu(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    if not any(op in text for op in NONDETERMINISTIC_ON_CUDA):
        return []
    found = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        for sentence in re.split(r"(?<=[.:;])\s", "".join(cell["source"])):
            if BITWISE.search(sentence) and not NEGATED.search(sentence) and "CPU" not in "".join(cell["source"]):
                found.append(f"cell {i}: {sentence.strip()[:120]}")
    return found


def test_the_determinism_check_sees_a_gpu_only_claim(tmp_path):
    def notebook(words):
        cells = [{"cell_type": "code", "source": ["F.scaled_dot_product_attention(q, k, v)"]},
                 {"cell_type": "markdown", "source": [words]}]
        path = tmp_path / "n.ipynb"
        path.write_text(json.dumps({"cells": cells}))
        return path

    assert bitwise_claims_without_cpu(notebook("Both give bitwise the same gradients."))
    assert not bitwise_claims_without_cpu(notebook("Bitwise the same gradients on this CPU; on CUDA not always."))
    assert not bitwise_claims_without_cpu(notebook("Expect equality in distribution, not bit for bit."))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_bitwise_claims_say_they_are_the_cpus(path):
    found = bitwise_claims_without_cpu(path)
    assert not found, (f"{path.stem}: bitwise equality claimed next to operations whose CUDA kernels are "
                       "non-deterministic, without saying it holds on the CPU:\n" + "\n".join(found))


# ---- 5. collectives refuse tensors off the rank's device -----------------------------------------------

def _all_reduce_made(rank, world_size, how):
    t = {"without a device": lambda: torch.ones(4), "computed from one": lambda: torch.ones(4) * 2,
         "with the device": lambda: torch.ones(4, device="cpu"), "moved": lambda: torch.ones(4).to("cpu"),
         "copied into a device tensor": lambda: torch.zeros(4, device="cpu").copy_(torch.ones(4))}[how]()
    dist.all_reduce(t)
    return t.tolist()


@pytest.mark.parametrize("how", ["without a device", "computed from one"])
def test_a_collective_on_a_tensor_made_on_the_host_would_fail_under_nccl(how):
    with pytest.raises(RankFailed, match="would fail under NCCL: dist.all_reduce was given a tensor made without"):
        launch(_all_reduce_made, 2, how, strict=True, timeout=30)
    assert launch(_all_reduce_made, 2, how, timeout=30)[0] == [2.0] * 4 or how == "computed from one"


@pytest.mark.parametrize("how", ["with the device", "moved", "copied into a device tensor"])
def test_tensors_on_the_rank_device_pass(how):
    assert launch(_all_reduce_made, 2, how, strict=True, timeout=30)[0] == [2.0] * 4


def _mini_fsdp_losses(rank, world_size, source):
    from autograder.authoring.course import load_course
    from autograder.exercises.beside.define import define_function
    from autograder.exercises.mini_fsdp.cases import cases
    from autograder.exercises.mini_fsdp.observe import student_rank

    spec = load_course().spec_for_exercise("MiniFSDP")
    cls = define_function([("setup", c) for c in spec.setup_code] + [("cell", source)], "MiniFSDP")
    case = next(c for c in cases(0).values() if not c["gated"] and c["world_size"] == world_size)
    return student_rank(rank, world_size, cls, case)["losses"]


def test_mini_fsdp_keeps_the_device_rule_and_its_old_defect_is_caught():
    from submission_factory import reference_source

    source = reference_source("MiniFSDP")
    assert launch(_mini_fsdp_losses, 2, source, strict=True, timeout=60)[0]
    defect = source.replace("shard.new_empty(shard.numel() * self.world_size)",
                            "torch.empty(shard.numel() * self.world_size)")
    assert defect != source
    with pytest.raises(RankFailed, match="would fail under NCCL: dist.all_gather_single"):
        launch(_mini_fsdp_losses, 2, defect, strict=True, timeout=60)


# ---- 6. Triton kernels touch only their tensors -------------------------------------------------------------

class _Watched:
    """A lesson kernel whose every launch runs in the interpreter, counted with the tensors it was given."""

    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = interpreted(kernel), launches

    def __getitem__(self, grid):
        def launch(*args, **meta):
            with count_traffic([a for a in args if isinstance(a, torch.Tensor)]) as traffic:
                self.kernel[grid](*args, **meta)
            self.launches.append(traffic)
        return launch


def _lesson10(edit=lambda source: source):
    """Lesson 10's kernels and Functions, each kernel launch watched: (namespace, launches)."""
    pytest.importorskip("triton")
    from bench.evidence_kernels import lesson_kernels
    triton_mode()  # the interpreter when there is no GPU, before the kernels are decorated
    namespace, launches = lesson_kernels(edit), []
    for name in [name for name in namespace if name.endswith("_kernel")]:
        namespace[name] = _Watched(namespace[name], launches)
    return namespace, launches


def _every_kernel_at_sizes_that_are_not_multiples_of_its_blocks(lesson):
    """RMSNorm forward and backward, FlashAttention (plain and causal), the fused linear + cross-entropy; every
    input a view into a larger tensor, so a lane past the end reads mapped memory in the interpreter."""
    torch.manual_seed(0)
    inside = lambda *shape: torch.randn(shape[0] + 8, *shape[1:])[: shape[0]]
    x, weight = inside(37, 200).requires_grad_(), inside(200).requires_grad_()
    lesson["FusedRMSNorm"].apply(x, weight).sum().backward()
    q, k, v = (inside(1, 2, 40, 16) for _ in range(3))
    for causal in (False, True):
        lesson["TritonFlashAttention"].apply(q, k, v, causal)
    h, w = inside(37, 32).requires_grad_(), inside(1000, 32).requires_grad_()
    lesson["FusedLinearCrossEntropy"].apply(h, w, torch.randint(0, 1000, (37,))).backward()


def test_lesson10s_kernels_touch_only_the_tensors_they_are_given():
    """A lane outside every tensor of its launch is an illegal memory access on a GPU, which the interpreter reads
    without a word: every kernel of Lesson 10, at sizes its blocks do not divide, keeps inside its tensors."""
    lesson, launches = _lesson10()
    _every_kernel_at_sizes_that_are_not_multiples_of_its_blocks(lesson)
    assert len(launches) == 5 and all(t.bytes for t in launches)
    assert [sum(t.outside.values()) for t in launches] == [0] * 5


def test_a_kernel_that_reads_past_the_vocabulary_is_caught():
    """The fused cross-entropy's last chunk of W without its mask: right values here (its logits are masked to
    −inf afterwards), 24 rows of W read past the end, which a GPU does not forgive."""
    unmasked = lambda source: source.replace("mask=in_vocab[:, None], other=0.0", "")
    lesson, launches = _lesson10(unmasked)
    _every_kernel_at_sizes_that_are_not_multiples_of_its_blocks(lesson)
    assert [sum(t.outside.values()) > 0 for t in launches] == [False] * 4 + [True]
