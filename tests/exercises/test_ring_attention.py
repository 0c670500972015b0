"""Lesson 8's ring_attention grader, beyond the variant suite: why its feedback is true, and that it leaves no process
behind.

* The reference's ranks equal full attention over the whole sequence (the truth the checks compare with), and its
  record is the ring the feedback describes: N−1 hops of K and V to rank r+1, from rank r−1, no collective.
* The grader's record of point-to-point messages sees every API a student may call (send, isend, batch_isend_irecv,
  a name imported before the fork), with its peer and size.
* Grading forks ranks; afterwards no process is left, also when a submission deadlocks its ranks or gets a rank
  killed by gloo (SIGABRT, a message of the wrong size), which becomes that student's reason.
"""
import multiprocessing

import pytest
import torch
import torch.distributed as dist
from conftest import grade_source, reference_observation
from processes import descendants_left
from submission_factory import grade_one_exercise_class, reference_source
from variants.ring_attention import WRONG

from autograder.exercises.ring_attention import checks, observe
from coursekit.dist import launch

EX, NB = "ring_attention", "08_multidim_parallel.ipynb"


@pytest.mark.parametrize("salt", [0, 1])
def test_reference_is_full_attention_and_a_ring(salt):
    ref = reference_observation(EX, salt)
    for name, observed in ref["scenarios"].items():
        c, n = observed["case"], observed["case"]["world_size"]
        chunk_values = 2 * c["chunk"] * c["d"] * int(torch.tensor(c["lead"]).prod())
        for rank, (r, truth) in enumerate(zip(observed["ranks"], ref["full"][name])):
            assert checks.close(r["output"], truth, atol=2e-6), (name, rank)
            assert r["collectives"] == [], (name, rank)
            assert r["sends"] == [[(rank + 1) % n, chunk_values]] * (n - 1), (name, rank)
            assert r["recvs"] == [[(rank - 1) % n, chunk_values]] * (n - 1), (name, rank)


def _p2p_seen(rank, world_size):
    from torch.distributed import isend as imported_isend

    log = observe.P2PLog()
    t, into = torch.ones(3), torch.empty(3)
    peer = 1 - rank
    if rank == 0:
        dist.send(t, peer)
        imported_isend(t, peer).wait()
        dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(5), peer)])[0].wait()
    else:
        dist.recv(into, peer)
        dist.irecv(into, peer).wait()
        dist.batch_isend_irecv([dist.P2POp(dist.irecv, torch.empty(5), peer)])[0].wait()
    return log.sends, log.recvs


def test_the_record_sees_every_point_to_point_api():
    (sends, _), (_, recvs) = launch(_p2p_seen, 2, backend="gloo", timeout=60)
    assert sends == [[1, 3], [1, 3], [1, 5]] and recvs == [[0, 3], [0, 3], [0, 5]]


def test_a_rank_killed_by_gloo_is_that_students_reason(subreaper):
    results = grade_source(EX, WRONG["receives_half_the_message"][0])
    assert all(r.score == 0 for r in results)
    assert all("SIGABRT" in r.feedback for r in results[:4]), [r.feedback for r in results]
    assert multiprocessing.active_children() == [] and descendants_left() == []


def test_no_process_left_after_grading_in_this_process(subreaper):
    for source in (reference_source(EX), WRONG["deadlocks_on_three_ranks"][0]):
        grade_source(EX, source)
        assert multiprocessing.active_children() == []
        assert descendants_left() == []


@pytest.mark.slow
def test_class_grading_full_partial_zero_and_deadlock_without_leftovers(tmp_path, subreaper):
    """`python -m autograder grade` on held-out scenarios: the solution full, a backward ring partial, the blank
    notebook 0, a gather partial, a deadlock partial with the collective sentence."""
    rows = grade_one_exercise_class(tmp_path, NB, EX, {"alice": reference_source(EX), "bob": None,
                                                       "carl": WRONG["ring_runs_backwards"][0],
                                                       "dora": WRONG["deadlocks_on_three_ranks"][0],
                                                       "emil": WRONG["all_gathers_k_and_v"][0]})
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == 10, rows["alice"]["feedback"]
    assert float(rows["bob"]["score"]) == 0 and "NotImplementedError" in rows["bob"]["feedback"]
    assert 0 < float(rows["carl"]["score"]) < 10 and "r+1" in rows["carl"]["feedback"]
    assert 0 < float(rows["dora"]["score"]) < 10 and rows["dora"]["cause"] == "deadlocks_on_three_ranks"
    assert float(rows["emil"]["score"]) == 8 and "all_gather" in rows["emil"]["feedback"]
    assert descendants_left() == []
