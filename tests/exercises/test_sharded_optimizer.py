"""Lesson 5's ShardedOptimizer grader, beyond the variant suite: why its feedback is true, and that it leaves no
process behind.

* The reference, on every rank and after every step, holds exactly the unsharded optimizer's parameters (the
  grader's ground truth, run on the same gradients), and its ranks' optimizer state adds up to the unsharded one:
  so the checks may say "unsharded AdamW" and "1/N of the state".
* The state measurement finds a torch optimizer wherever the student's object keeps it, counts each storage once,
  and leaves out Adam's scalar step counter.
* Grading forks ranks (here, and in the sandboxed workers of ``python -m autograder grade``); afterwards no process
  is left, also when the submission deadlocks its ranks.
"""
import math
import multiprocessing

import pytest
import torch
from conftest import grade_source, reference_observation
from processes import descendants_left
from submission_factory import grade_one_exercise_class, reference_source
from variants.sharded_optimizer import WRONG

from autograder.exercises.sharded_optimizer import cases, checks, observe

EX, NB = "ShardedOptimizer", "05_fsdp_zero.ipynb"


def test_reference_equals_the_unsharded_optimizer_and_shards_its_state():
    ref = reference_observation(EX)
    for name in cases.SCENARIOS:
        if name == "memory":
            continue
        ranks = ref["scenarios"][name]["ranks"]
        want = ref["scenarios"][name]["truth"]
        for r in ranks:
            assert r["forbidden"] is False
            for step, expected in enumerate(want["steps"]):
                assert checks.same(r["steps"][step], expected), f"{name}: a reference rank differs after step {step + 1}"
        moved = max(abs(a - b) for t, t0 in zip(want["steps"][-1], ranks[0]["initial"]) for a, b in zip(t, t0))
        assert moved > 100 * cases.PARAM_ATOL, "training must move the weights far more than the tolerance"
        assert sum(r["state_bytes"] for r in ranks) == want["state_bytes"] > 0, name


def test_the_memory_scenario_separates_sharded_from_unsharded():
    """The reference's ranks end with the unsharded optimizer's parameters (the evidence passes on the reference),
    and between steps they hold far less than the unsharded optimizer's ranks: the threshold, halfway, has room on
    both sides (at least a quarter of the AdamW state of the parameters)."""
    ref = reference_observation(EX)
    observed, c = ref["scenarios"]["memory"], cases.cases(0)["memory"]
    assert checks.checksums_problem(observed, observed) is None
    sharded = checks.held_between_steps(observed["meter"], c)
    unsharded = checks.held_between_steps(observed["truth"]["meter"], c)
    state = 2 * cases.LARGE_TENSORS * math.prod(cases.LARGE_SHAPE) * 4
    assert min(unsharded) - max(sharded) > state / 2, (sharded, unsharded)


def test_state_bytes_finds_the_optimizer_wherever_it_is_kept():
    weight = torch.nn.Parameter(torch.ones(4, 3))
    adam = torch.optim.AdamW([weight], lr=0.1)
    weight.grad = torch.ones(4, 3)
    adam.step()
    moments = 2 * weight.numel() * weight.element_size()  # exp_avg, exp_avg_sq; the scalar step is not state
    assert observe.state_bytes(adam) == moments

    class Holder:
        def __init__(self):
            self.shards = [{"local": adam}]
            self.again = adam  # the same optimizer twice: counted once

    assert observe.state_bytes(Holder()) == moments
    assert observe.state_bytes(object()) == 0


@pytest.mark.slow  # grades a deadlock: the launch timeout in every scenario
def test_no_process_left_after_grading_in_this_process(subreaper):
    for source in (reference_source(EX), WRONG["empty_shard_crashes"][0], WRONG["only_the_owner_broadcasts"][0]):
        grade_source(EX, source)
        assert multiprocessing.active_children() == []
        assert descendants_left() == []


@pytest.mark.slow
def test_class_grading_full_partial_zero_and_deadlock_without_leftovers(tmp_path, subreaper):
    """`python -m autograder grade`: the reference full, a wrong variant partial, blank 0, a deadlock 0."""
    rows = grade_one_exercise_class(tmp_path, NB, EX, {"alice": reference_source(EX), "bob": None,
                                                       "carl": WRONG["every_rank_steps_everything"][0],
                                                       "dana": WRONG["only_the_owner_broadcasts"][0]})
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == 11, rows["alice"]["feedback"]
    assert float(rows["bob"]["score"]) == 0 and "NotImplementedError" in rows["bob"]["feedback"]
    assert 0 < float(rows["carl"]["score"]) < 11 and rows["carl"]["cause"] == "every_rank_steps_everything", rows["carl"]
    assert float(rows["dana"]["score"]) == 0 and rows["dana"]["cause"] == "only_the_owner_broadcasts", rows["dana"]
    assert descendants_left() == []
