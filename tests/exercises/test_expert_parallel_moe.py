"""Lesson 8's ExpertParallelMoE grader, beyond the variant suite: why its feedback is true, and that it leaves no
process behind.

* The reference's ranks equal the dense single-process MoE over all ranks' tokens (output, x.grad, the experts'
  gradients, the router's summed over the ranks), the truth the checks compare with; its record is the one the
  feedback describes: all-to-alls only, three in the forward (counts, dispatch, combine) and two in the backward.
* The skewed scenario really has a rank that receives no token, and the poisoned experts really differ: a rank that
  runs another rank's expert gets wrong values.
* Grading forks ranks; afterwards no process is left, also when mismatched split sizes get a rank killed by gloo
  (SIGABRT), which becomes that student's reason.
"""
import multiprocessing

import pytest
import torch
from conftest import grade_source, reference_observation
from processes import descendants_left
from submission_factory import grade_one_exercise_class, reference_source
from variants.expert_parallel_moe import WRONG

from autograder.exercises.expert_parallel_moe import cases, checks, observe

EX, NB = "ExpertParallelMoE", "08_multidim_parallel.ipynb"


@pytest.mark.parametrize("salt", [0, 1])
def test_reference_is_the_dense_moe_and_uses_all_to_all_only(salt):
    ref = reference_observation(EX, salt)
    traffic = ref["scenarios"]["traffic"]
    assert checks.moe_really_ran(traffic, traffic) is None
    assert checks.fingerprint_problem(traffic["ranks"], traffic) is None
    for name, observed in ref["scenarios"].items():
        if name == "traffic":
            continue
        c, dense = observed["case"], ref["dense"][name]
        per_rank = c["experts"] // c["world_size"]
        ranks = observed["ranks"]
        for rank, r in enumerate(ranks):
            assert checks.close(r["output"], dense["output"][rank], atol=1e-6), (name, rank)
            assert checks.close(r["x_grad"], dense["x_grad"][rank], atol=1e-6), (name, rank)
            for j, grads in enumerate(r["expert_grads"]):
                assert checks.close(grads, dense["expert_grads"][rank * per_rank + j], atol=1e-5), (name, rank, j)
            assert {kind for kind, _ in r["forward"] + r["backward"]} == {"all_to_all"}, (name, rank)
            assert (len(r["forward"]), len(r["backward"])) == (3, 2), (name, rank)
        total = [sum(r["router_grad"][i] for r in ranks) for i in range(len(ranks[0]["router_grad"]))]
        assert checks.close(total, dense["router_grad"], atol=1e-5), name


def test_the_traffic_scenario_is_the_tokens_all_to_all():
    """The reference's bytes on the loopback are its tokens' all-to-alls (each token that leaves its rank, four times:
    dispatch and combine, forward and backward), within 10 %. The thriftiest gather (every token to every
    rank, the outputs back by reduce-scatter, the same in the backward) sends about N times that: the threshold,
    TRAFFIC_RATIO, lies halfway (geometrically) between them; moving the experts instead of the tokens far beyond."""
    ref = reference_observation(EX)
    c = ref["scenarios"]["traffic"]["case"]
    router, _ = observe.make_layers(c)
    per_rank = c["experts"] // c["world_size"]
    leaving = 0
    for rank in range(c["world_size"]):
        x, _ = observe.rank_tokens(c, rank)
        leaving += int((router(x).argmax(-1) // per_rank != rank).sum())
    all_to_alls = 4 * leaving * c["d"] * 4
    sent = ref["scenarios"]["traffic"]["meter"]["lo_bytes"]
    assert all_to_alls <= sent < 1.1 * all_to_alls, (sent, all_to_alls)  # + counts, the store, TCP headers
    # payload against payload: a gather's bytes on the loopback carry headers in the same proportion as the method's
    gather = 4 * (c["world_size"] - 1) * sum(c["tokens"]) * c["d"] * 4
    assert gather > 1.9 * cases.TRAFFIC_RATIO * all_to_alls, (gather, all_to_alls)
    # issue 37: moving each expert to every rank (and its gradient back) instead of the tokens costs far more still
    expert_bytes = (2 * c["d"] * c["hidden"] + c["hidden"] + c["d"]) * 4
    moving_experts = 2 * c["world_size"] * (c["world_size"] - 1) * expert_bytes
    assert moving_experts > 10 * cases.TRAFFIC_RATIO * all_to_alls, (moving_experts, all_to_alls)


def test_the_skewed_scenario_leaves_the_last_rank_idle():
    for salt in (0, 1, 2, 3):
        c = cases.cases(salt)["three_ranks_skewed"]
        per_expert = observe.dense_moe(c)["tokens_per_expert"]
        assert sum(per_expert[-c["experts"] // c["world_size"]:]) == 0 and per_expert[0] > 0, (salt, per_expert)


def test_only_the_owner_holds_an_expert_s_true_weights():
    c = cases.cases(0)["two_ranks"]
    _, true = observe.make_layers(c)
    for rank in range(c["world_size"]):
        _, held = observe.make_layers(c, rank)
        for e, (a, b) in enumerate(zip(true, held)):
            same = all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
            assert same == (e // (c["experts"] // c["world_size"]) == rank), (rank, e)


def test_mismatched_splits_are_that_students_reason(subreaper):
    results = grade_source(EX, WRONG["assumes_it_receives_what_it_sends"][0])
    more_ranks = next(r for r in results if "3 ranks" in r.title)
    assert more_ranks.score == 0 and "SIGABRT" in more_ranks.feedback, more_ranks.feedback
    assert multiprocessing.active_children() == [] and descendants_left() == []


def test_no_process_left_after_grading_in_this_process(subreaper):
    for source in (reference_source(EX), WRONG["skips_experts_without_rows"][0]):
        grade_source(EX, source)
        assert multiprocessing.active_children() == []
        assert descendants_left() == []


@pytest.mark.slow
def test_class_grading_full_partial_zero_without_leftovers(tmp_path, subreaper):
    """`python -m autograder grade` on held-out scenarios: the solution full, a dispatch outside autograd partial, the
    blank notebook 0, a gather partial."""
    rows = grade_one_exercise_class(tmp_path, NB, EX, {"alice": reference_source(EX), "bob": None,
                                                       "carl": WRONG["dispatch_outside_autograd"][0],
                                                       "dora": WRONG["all_gathers_the_tokens"][0]})
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == 11, rows["alice"]["feedback"]
    assert float(rows["bob"]["score"]) == 0 and "NotImplementedError" in rows["bob"]["feedback"]
    assert 0 < float(rows["carl"]["score"]) < 11 and "autograd functions" in rows["carl"]["feedback"]
    assert float(rows["dora"]["score"]) == 9 and "all_gather" in rows["dora"]["feedback"]
    assert descendants_left() == []
