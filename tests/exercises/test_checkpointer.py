"""Checkpointer (Lesson 9) graded by the class grader, through the sandbox (where torch's FSDP is switched off: the
grader's model shards itself with DTensors) on held-out scenarios; and the grader's own cut of a save."""
import os

import pytest
from processes import descendants_left
from submission_factory import grade_one_exercise_class, reference_source
from variants.checkpointer import WRONG

from autograder.exercises.beside.ranks import run_on_ranks
from autograder.exercises.checkpointer.cases import SAME_RTOL, cases
from autograder.exercises.checkpointer.checks import flat
from autograder.exercises.checkpointer.observe import cut_off, never_failed, snapshot, whole_state
from autograder.exercises.judging.checking import close

EX, NB = "Checkpointer", "09_failures.ipynb"


@pytest.mark.slow
def test_class_grading_full_partial_zero_without_leftovers(tmp_path, subreaper):
    """The solution full, a classic mistake partial, the blank notebook 0, and no process left: through the real
    sandbox, in a worker that keeps the FSDP and tensor-parallel modules DCP imports (Exercise.needs_libraries)."""
    rows = grade_one_exercise_class(tmp_path, NB, EX, {"alice": reference_source(EX), "bob": None,
                                                       "carl": WRONG["optimizer_not_resharded"][0]})
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) == 12, rows["alice"]["feedback"]
    assert float(rows["bob"]["score"]) == 0 and "NotImplementedError" in rows["bob"]["feedback"]
    assert 0 < float(rows["carl"]["score"]) < 12, rows["carl"]["feedback"]
    assert descendants_left() == []


def _save(folder, step, *, publish):
    """A save as DCP makes it: shards, then the metadata written to a temporary name and renamed (published)."""
    folder.mkdir(parents=True)
    for rank in range(2):
        (folder / f"__{rank}_0.distcp").write_bytes(bytes([step]) * 100)
    (folder / ".metadata.tmp").write_bytes(b"m" * 10)
    if publish:
        os.replace(folder / ".metadata.tmp", folder / ".metadata")


def test_the_cut_undoes_the_last_operation_and_halves_the_file_before(tmp_path):
    _save(tmp_path / "step_1", 1, publish=True)
    before = snapshot(tmp_path, contents=True)
    _save(tmp_path / "step_2", 2, publish=True)
    cut_off(tmp_path, before)
    assert not (tmp_path / "step_2" / ".metadata").exists()  # the publish never happened
    sizes = sorted((tmp_path / "step_2" / f"__{r}_0.distcp").stat().st_size for r in range(2))
    assert sizes == [50, 100]  # the shard written just before it was being written
    assert (tmp_path / "step_1" / ".metadata").stat().st_size == 10  # the complete save is untouched


def test_a_file_written_in_place_is_cut_and_a_file_renamed_over_is_restored(tmp_path):
    (tmp_path / "in_place.pt").write_bytes(b"1" * 100)
    (tmp_path / "pointer").write_bytes(b"step 1")
    before = snapshot(tmp_path, contents=True)
    with open(tmp_path / "in_place.pt", "wb") as f:  # the same file, overwritten
        f.write(b"2" * 100)
    (tmp_path / "pointer.tmp").write_bytes(b"step 2")
    os.replace(tmp_path / "pointer.tmp", tmp_path / "pointer")  # published last
    cut_off(tmp_path, before)
    assert (tmp_path / "pointer").read_bytes() == b"step 1"
    assert (tmp_path / "in_place.pt").read_bytes() == b"2" * 50


@pytest.mark.slow
def test_each_killed_run_is_answered_seeds_of_its_own():
    """The launcher's answers after each save weigh the next step: two observations of the same submission train
    the same first step and read the same batches, then part (so no load() can replay the training from the case's
    seeds, tests/variants/checkpointer.py ``replays_training_in_load``); each is judged against its own run that
    never failed, and the reference scores full against itself and another observation of itself."""
    from conftest import grade_source, reference_observation, student_observation

    one, two = reference_observation(EX), student_observation(EX, reference_source(EX))
    for key in ("same_size", "resize"):
        a, b = (o["scenarios"][key]["meter"]["never_failed"] for o in (one, two))
        assert close(flat(a["read"]), flat(b["read"]), atol=1e-6) and close(a["first"], b["first"], atol=1e-6)
        assert max(abs(x - y) for x, y in zip(a["final"], b["final"])) > 1e-3
    assert all(r.passed for r in grade_source(EX, reference_source(EX)))


_RANKS_WARM_OR_COLD = '''
import json, sys
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from autograder.exercises.beside.ranks import run_on_ranks
from autograder.exercises.beside import warm_sharding
from autograder.exercises.checkpointer import observe

def rank(rank, world_size, case):
    model, optimizer, loader = observe.new_run(case)
    read = [observe.train_step(model, optimizer, loader, seed) for seed in (None, 7, 8)]
    model_state, optim_state = get_state_dict(model, optimizer)
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
    read.append(observe.train_step(model, optimizer, loader, 9))
    local = [[list(t.to_local().shape), repr(t.placements), t.to_local().double().sum().item()]
             for p in model.parameters() for t in (p, *optimizer.state[p].values()) if hasattr(t, "to_local")]
    whole = observe.own_rows(model, optimizer) if not case["memory"] else observe.trained_digest(model)
    return {"read": read, "local": local, "whole": whole}

cases = observe.cases(3)
if sys.argv[1] == "warm":
    warm_sharding.warm(observe.warm_runs(cases.values()), observe.warm_up)
found = {f"{key} on {size}": run_on_ranks(rank, size, case, timeout=60).get("ranks")
         for key, size in (("resize", 2), ("resize", 3), ("memory", 2)) for case in [cases[key]]}
print(json.dumps(found))
'''


@pytest.mark.slow
def test_ranks_forked_after_the_warm_up_compute_what_cold_ranks_compute():
    """beside/warm_sharding.py: ranks that inherit the launcher's warmed sharding caches (and rebind its mesh) give
    every rank, on 2 and 3 ranks (uneven shards, one empty), the same local shapes, placements and values as cold
    ranks."""
    import json
    import subprocess
    import sys

    cold, warmed = (json.loads(subprocess.run([sys.executable, "-c", _RANKS_WARM_OR_COLD, side], check=True,
                                              capture_output=True, text=True).stdout.splitlines()[-1])
                    for side in ("cold", "warm"))
    assert all(ranks for ranks in cold.values()), cold
    assert warmed == cold


def _trains(rank: int, world_size: int, case: dict, answers: list) -> dict:
    """The killed run's training on real ranks, without a checkpointer: what it read, and each rank's rows of the
    state after every step."""
    from autograder.exercises.checkpointer import observe

    model, optimizer, loader = observe.new_run(case)
    read, states = [], [observe.own_rows(model, optimizer)]
    for step in range(case["steps"]):
        read.append(observe.train_step(model, optimizer, loader, observe.seed_of(case, answers, step)))
        states.append(observe.own_rows(model, optimizer))
    return {"read": read, "states": states}


def test_the_launchers_run_that_never_failed_is_the_ranks_run():
    """observe.never_failed recomputes the killed run's training in the launcher with plain tensors: on the killed
    run's two ranks (uneven shards, one empty) it reads what they read and ends every step on their parameters and
    AdamW moments, under the launcher's seeds. The same ops on the same shapes: bit for bit on this machine; asserted
    to float32 round-off (SAME_RTOL, what the checks allow), as any comparison of two code paths on any CPU."""
    case = cases(5)["same_size"]
    answers = [float(seed) for seed in range(7, 7 + case["steps"] - 1)]
    found = run_on_ranks(_trains, case["killed_on"], case, answers, timeout=60)
    every = list(range(case["steps"] + 1))
    truth = never_failed(case, answers, every, every)
    assert close(flat(truth["read"]), flat(found["ranks"][0]["read"]), atol=0.0, rtol=SAME_RTOL)
    for step in every:
        ranks = whole_state([r["states"][step] for r in found["ranks"]])
        assert truth["states"][step]["adam_step"] == ranks["adam_step"], step
        for key in ("params", "moments"):
            assert close(truth["states"][step][key], ranks[key], atol=1e-9, rtol=SAME_RTOL), (step, key)
