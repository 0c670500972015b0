"""Lesson 3's `BucketedDDP` grader, beyond the variant suite: why its feedback is true, and that it leaves no
process behind.

* The reference solution's gradients and trained weights equal torch's DistributedDataParallel in every scenario
  (so a check may say "DDP"), and training moves the weights far more than the tolerance.
* The grader's event record shows what the overlap check claims: the reference has all-reduces in flight while
  gradients are still being computed, in every multi-bucket scenario and step; with one bucket it cannot.
* DDP leaves the frozen and the unused parameters' .grad None, the reason for "leave .grad None".
* Grading forks ranks; afterwards no process is left, also when the submission spins forever in its ranks, and
  class grading (`python -m autograder grade`) gives the solution full marks, the blank notebook and torch's DDP
  in disguise 0.
"""
import multiprocessing

import pytest
from conftest import grade_source, reference_observation
from processes import descendants_left
from submission_factory import grade_one_exercise_class, reference_source
from variants.bucketed_ddp import WRONG

from autograder.exercises.bucketed_ddp import cases, checks

EX, NB = "BucketedDDP", "03_data_parallel.ipynb"


def test_reference_equals_ddp():
    ref = reference_observation(EX)
    for name in (n for n in cases.SCENARIOS if n != "overlap"):
        assert len(ref["scenarios"][name]["ranks"]) == ref["scenarios"][name]["case"]["world_size"]
        assert checks.gradient_problem(ref, ref, name) is None, name
    rank0 = ref["scenarios"]["three_ranks"]["ranks"][0]
    moved = max(abs(a - b) for a, b in zip(rank0["final"], rank0["after_init"]))
    assert moved > 100 * cases.PARAM_ATOL, "training must move the weights far more than the tolerance"


def in_flight_while_computing(events: list) -> int:
    """The rank's own hook log: how many gradients became ready while some all-reduce was issued and not yet waited for."""
    outstanding, count = set(), 0
    for event in events:
        if event[0] == "issue":
            outstanding.add(event[1])
        elif event[0] == "wait":
            outstanding.discard(event[1])
        elif event[0] == "ready" and outstanding:
            count += 1
    return count


def test_reference_overlaps_and_one_bucket_cannot():
    ref = reference_observation(EX)
    gates = ref["scenarios"]["overlap"]["meter"]["gates"]  # measured from outside the ranks
    assert gates["continued"] and gates["sent_while_held"] >= gates["bucket_bytes"], gates
    for name in ("per_param", "mid", "three_ranks", "special"):
        for r in ref["scenarios"][name]["ranks"]:
            assert all(in_flight_while_computing(s["events"]) >= 2 for s in r["steps"]), name
    for r in ref["scenarios"]["one_bucket"]["ranks"]:
        assert all(in_flight_while_computing(s["events"]) == 0 for s in r["steps"])


def test_ddp_leaves_frozen_and_unused_gradients_none():
    ref = reference_observation(EX)
    names = ref["scenarios"]["special"]["ranks"][0]["names"]
    missing = {name for name, g in zip(names, ref["ddp"]["special"]["grads"][0]) if g is None}
    assert missing == {"hidden1.bias", "unused.weight", "unused.bias"}
    assert "head.weight" not in names  # tied to embed.weight: one parameter


@pytest.mark.slow  # grades a deadlock: the launch timeout in every scenario
def test_no_process_left_after_grading_in_this_process(subreaper):
    for source in (reference_source(EX), WRONG["waits_forever_for_unused_parameter"][0]):
        grade_source(EX, source)
        assert multiprocessing.active_children() == []
        assert descendants_left() == []


@pytest.mark.slow
def test_class_grading_full_zero_and_hostile_without_leftovers(tmp_path, subreaper):
    """`python -m autograder grade`: the solution full, a classic mistake partial, blank 0, wrapped DDP 0."""
    rows = grade_one_exercise_class(tmp_path, NB, EX, {"alice": reference_source(EX), "bob": None,
                                                       "carl": WRONG["all_reduce_only_after_backward"][0],
                                                       "dora": WRONG["wraps_torch_ddp"][0]})
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == 11, rows["alice"]["feedback"]
    assert float(rows["bob"]["score"]) == 0 and "NotImplementedError" in rows["bob"]["feedback"]
    assert 0 < float(rows["carl"]["score"]) < 11 and "after backward" in rows["carl"]["feedback"]
    assert float(rows["dora"]["score"]) == 0 and "DistributedDataParallel" in rows["dora"]["feedback"]
    assert descendants_left() == []


@pytest.mark.parametrize("death", ["aborted", "rank 0 died without a result (signal SIGSEGV)"])
def test_buckets_of_different_sizes_are_named_however_the_rank_dies(death):
    """Buckets built in another order on each rank meet in one all-reduce with different sizes: gloo aborts the rank
    that checks the size, or (under load, when another rank reads the broken stream first) that rank dies of another
    signal. Either way the cause is named."""
    from conftest import student_observation

    from autograder.exercises import get_exercise
    from autograder.exercises.judging.diagnosis import diagnose

    ex, reference = get_exercise("BucketedDDP"), reference_observation("BucketedDDP")
    student = student_observation("BucketedDDP", WRONG["rank_dependent_bucket_order"][0])
    student["scenarios"]["special"] = {"case": student["scenarios"]["special"]["case"], "error": death}
    assert diagnose(ex, student, reference, ex.grade(student, reference)).cause_id == "rank_dependent_bucket_order"
