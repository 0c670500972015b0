"""Lesson 3's grader, beyond the variant suite: why its feedback is true, and that it leaves no process behind.

* The reference's manual data-parallel loop equals torch's DistributedDataParallel and one process on the
  full batch, so a check that compares with the reference may say "DDP" and "one process" in its feedback.
* DDP leaves the gradient of a frozen or unused parameter None, and a zero gradient would move such a
  parameter under weight decay: the reasons given for "leave .grad None alone".
* Grading really forks ranks (in this process, and inside the sandboxed workers of ``python -m autograder
  grade``); afterwards no process may be left, even when the submission deadlocks its ranks.
"""
import multiprocessing

import pytest
import torch
from conftest import grade_source, reference_observation
from processes import descendants_left
from submission_factory import grade_one_exercise_class, reference_source
from variants.average_gradients import WRONG

from autograder.exercises.average_gradients import cases, checks, observe
from coursekit.dist import launch

EX, NB = "average_gradients", "03_data_parallel.ipynb"


def test_reference_equals_ddp_and_one_process():
    ref = reference_observation(EX)
    for name in cases.SCENARIOS:
        finals = [r["final"] for r in ref["scenarios"][name]["ranks"]]
        ddp, single = ref["ddp"][name], ref["single"][name]
        for rank, final in enumerate(finals):
            assert checks.close(final, ddp[rank], atol=1e-6), f"{name}: reference rank {rank} differs from DDP"
            assert checks.close(final, single, atol=1e-6), f"{name}: reference rank {rank} differs from one process"
        start = ref["scenarios"][name]["ranks"][0]["calls"][0]["params_before"]
        moved = max(abs(a - b) for a, b in zip(finals[0], start))
        assert moved > 100 * cases.PARAM_ATOL, "training must move the weights far more than the tolerance"


def _ddp_missing_gradients(rank, world_size):
    model, x, y = observe.make_problem(world_size, with_unused=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    xb, yb = observe.local_batch(x, y, rank, world_size, 0)
    torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
    return {name: p.grad is None for name, p in model.named_parameters()}


def test_ddp_leaves_missing_gradients_none():
    import torch._dynamo  # noqa: F401  (DDP imports it lazily; once here rather than in each rank)

    for missing in launch(_ddp_missing_gradients, 2, backend="gloo", timeout=60):
        assert missing == {"hidden.weight": False, "hidden.bias": True, "out.weight": False, "out.bias": False,
                           "unused.weight": True, "unused.bias": True}


def test_zero_gradient_moves_a_weight_under_weight_decay():
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = observe.make_optimizer([weight])
    optimizer.step()  # .grad is None: skipped
    assert torch.equal(weight.detach(), torch.ones(3))
    weight.grad = torch.zeros(3)
    optimizer.step()
    assert not torch.equal(weight.detach(), torch.ones(3))


@pytest.mark.slow  # grades a deadlock: the launch timeout in every scenario
def test_no_process_left_after_grading_in_this_process(subreaper):
    for source in (reference_source(EX), WRONG["crashes_on_missing_grad"][0], WRONG["deadlocks_rank_one"][0]):
        grade_source(EX, source)
        assert multiprocessing.active_children() == []
        assert descendants_left() == []


@pytest.mark.slow
def test_class_grading_full_zero_and_deadlock_without_leftovers(tmp_path, subreaper):
    """`python -m autograder grade`: the solution scores full, the blank notebook 0, a deadlock 0 with a sentence."""
    rows = grade_one_exercise_class(tmp_path, NB, EX, {"alice": reference_source(EX), "bob": None,
                                                       "carl": WRONG["deadlocks_rank_one"][0]})
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == 11, rows["alice"]["feedback"]
    assert float(rows["bob"]["score"]) == 0 and "NotImplementedError" in rows["bob"]["feedback"]
    assert float(rows["carl"]["score"]) == 0 and rows["carl"]["cause"] == "deadlocks_rank_one"
    assert descendants_left() == []
