"""Lesson 4's TensorParallelMLP grader, beyond the variant suite: why its feedback is true, and that it leaves no
process behind.

* The reference's ranks equal the single-process MLP (output, x.grad, every shard's gradient), so the checks may
  say "the single-process MLP" in their feedback.
* The grader's collective count (torch's profiler) sees an all-reduce whichever API issued it, and nothing else.
* Grading forks ranks (here, and in the sandboxed workers of ``python -m autograder grade``); afterwards no process
  is left, also when the submission deadlocks its ranks.
"""
import multiprocessing

import pytest
import torch
import torch.distributed as dist
from conftest import grade_source, reference_observation
from processes import descendants_left
from submission_factory import grade_one_exercise_class, reference_source
from variants.tensor_parallel_mlp import WRONG

from autograder.exercises.beside.observing import collective_counts
from autograder.exercises.beside.ranks import warm_profiler
from autograder.exercises.tensor_parallel_mlp import cases, checks, observe
from coursekit.dist import launch

EX, NB = "TensorParallelMLP", "04_model_pipeline_parallel.ipynb"


def test_reference_equals_the_single_process_mlp():
    ref = reference_observation(EX)
    for name in ("two_ranks", "three_ranks"):
        single = ref["single"][name]
        for rank, r in enumerate(ref["scenarios"][name]["ranks"]):
            assert checks.close(r["output"], single["output"], atol=1e-6), (name, rank)
            assert checks.close(r["x_grad"], single["x_grad"], atol=1e-6), (name, rank)
            for role in cases.ROLES:
                assert checks.close(r["shards"][role]["grad"], single["shards"][rank][role]["grad"], atol=1e-6)
            assert r["forward"] == [["all_reduce", 1]] and r["backward"] == [["all_reduce", 1]], (name, rank)
    traffic = ref["scenarios"]["traffic"]
    assert checks.fingerprint_problem(traffic, traffic, "output") is None
    assert checks.fingerprint_problem(traffic, traffic, "x_grad") is None


def test_each_rank_holds_the_true_layers_only_in_its_own_block():
    """Inputs that require the method: the whole MLP run on one rank's layers is wrong; its own block is right."""
    c = cases.cases(0)["two_ranks"]
    fc1, fc2, x, _ = observe.make_problem(c)
    for rank in range(c["world_size"]):
        mine = slice(rank * c["per_rank"], (rank + 1) * c["per_rank"])
        held1, held2, held_x, _ = observe.make_problem(c, rank)
        assert torch.equal(held1.weight[mine], fc1.weight[mine]) and torch.equal(held2.weight[:, mine], fc2.weight[:, mine])
        assert torch.equal(held2.bias, fc2.bias) and torch.equal(held_x, x)
        assert not torch.allclose(held2(torch.nn.functional.gelu(held1(x))), fc2(torch.nn.functional.gelu(fc1(x))))


def test_the_traffic_scenario_separates_all_reduce_from_gathers():
    """Megatron's bytes per pass are an all-reduce of a (batch, d) tensor (up to the loopback's other traffic: here
    the machine's, in the grader's sandbox none), far from what a gather of the hidden activations or of the weights
    sends (TRAFFIC_RATIO has room on both sides)."""
    ref = reference_observation(EX)
    c = ref["scenarios"]["traffic"]["case"]
    sent = checks.pass_bytes(ref["scenarios"]["traffic"]["meter"], c)
    all_reduce = 2 * (c["world_size"] - 1) * c["batch"] * c["d_out"] * 4  # gloo's ring: 2(N−1)/N of it per rank
    gather_h = (c["world_size"] - 1) * c["batch"] * c["hidden"] * 4
    gather_w = (c["world_size"] - 1) * c["hidden"] * (c["d_in"] + c["d_out"] + 1) * 4
    for phase in ("forward", "backward"):
        assert all_reduce <= sent[phase] < all_reduce * 1.2, (phase, sent)
    assert min(gather_h, gather_w) > 2 * cases.TRAFFIC_RATIO * sent["forward"]


def _collectives_seen(rank, world_size):
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed import all_reduce as imported_all_reduce
    from torch.profiler import ProfilerActivity, profile

    t = torch.ones(3)
    seen = {}
    for label, call in {
        "dist.all_reduce": lambda: dist.all_reduce(t),
        "imported before the fork": lambda: imported_all_reduce(t),
        "async": lambda: dist.all_reduce(t, async_op=True).wait(),
        "functional": lambda: funcol.all_reduce(t, "sum", dist.group.WORLD).wait(),
        "all_gather": lambda: dist.all_gather([torch.empty(3) for _ in range(world_size)], t),
        "none": lambda: t + 1,
    }.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            call()
        seen[label] = collective_counts(prof)
    return seen


def test_the_count_sees_every_all_reduce_api_and_nothing_else():
    warm_profiler()
    seen = launch(_collectives_seen, 2, backend="gloo", timeout=60)[0]
    for label in ("dist.all_reduce", "imported before the fork", "async", "functional"):
        assert seen[label] == [["all_reduce", 1]], (label, seen[label])
    assert seen["all_gather"] == [["all_gather", 1]] and seen["none"] == []


@pytest.mark.slow  # grades a deadlock: the launch timeout in every scenario
def test_no_process_left_after_grading_in_this_process(subreaper):
    for source in (reference_source(EX), WRONG["shards_the_wrong_dimension"][0], WRONG["deadlocks_on_three_ranks"][0]):
        grade_source(EX, source)
        assert multiprocessing.active_children() == []
        assert descendants_left() == []


@pytest.mark.slow
def test_class_grading_full_partial_zero_and_deadlock_without_leftovers(tmp_path, subreaper):
    """`python -m autograder grade` on held-out scenarios: the solution full, a classic mistake partial, the blank
    notebook 0, a deadlock partial with the collective sentence."""
    rows = grade_one_exercise_class(tmp_path, NB, EX, {"alice": reference_source(EX), "bob": None,
                                                       "carl": WRONG["missing_backward_all_reduce"][0],
                                                       "dora": WRONG["deadlocks_on_three_ranks"][0]})
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == 12, rows["alice"]["feedback"]
    assert float(rows["bob"]["score"]) == 0 and "NotImplementedError" in rows["bob"]["feedback"]
    assert 0 < float(rows["carl"]["score"]) < 12 and rows["carl"]["cause"] == "no_backward_all_reduce", rows["carl"]
    assert 0 < float(rows["dora"]["score"]) < 12 and rows["dora"]["cause"] == "deadlocks_on_three_ranks", rows["dora"]
    assert descendants_left() == []
