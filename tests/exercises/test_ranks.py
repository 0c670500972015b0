"""The launcher of the grader's scenarios (exercises/beside/ranks.py), on its own."""
import pytest

from autograder.exercises.beside.ranks import Deferred, in_launches, observe_on_ranks, run_in_one_launch, run_on_ranks


def _answers_at_once(rank: int, world_size: int) -> dict:
    return {"rank": rank}


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ranks_that_never_communicate_all_answer(world_size):
    """A rank that answers at once must not end the process group under a peer still joining it (rank 0 hosts its
    store): without the launcher's barrier after joining, such a scenario failed now and then with gloo's "Connection
    closed by peer", more often under load, and a student whose ranks never communicate got no diagnosis."""
    for _ in range(3):
        found = run_on_ranks(_answers_at_once, world_size)
        assert "error" not in found, found
        assert [r["rank"] for r in found["ranks"]] == list(range(world_size))


def _calls(rank: int, world_size: int, fn) -> dict:
    return fn()


def test_a_cell_sees_its_rank_in_the_environment_when_it_is_defined():
    """As under torchrun: the student's cells run in each rank after RANK, WORLD_SIZE and MASTER_PORT are set, so a
    cell may read them at the top level (the group is joined only after the cells have run)."""
    cell = "import os\nSEEN = {k: os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'MASTER_PORT')}\n" \
           "def read():\n    return SEEN\n"
    found = run_on_ranks(_calls, 2, Deferred([("your cell", cell)], "read"))
    assert "error" not in found, found
    assert [(r["RANK"], r["WORLD_SIZE"]) for r in found["ranks"]] == [("0", "2"), ("1", "2")]
    assert found["ranks"][0]["MASTER_PORT"] == found["ranks"][1]["MASTER_PORT"] is not None


def _noisy(rank: int, world_size: int, fn, case: dict) -> dict:
    """Writes a warning and a line on file descriptor 2, then says where descriptor 2 points."""
    import os
    import warnings

    warnings.warn("a rank's warning", stacklevel=1)
    os.write(2, b"a rank's own line on stderr\n")
    return {"stderr": os.readlink("/proc/self/fd/2"), **({"forbidden": True} if case.get("forbid") else {})}


CASES = {"plain": {"world_size": 2}, "forbidden": {"world_size": 2, "forbid": True}}


@pytest.mark.parametrize("quiet", [False, True])
def test_observe_on_ranks_keeps_ranks_quiet_and_records_forbidden_false_by_default(capfd, quiet):
    """The plumbing every rank exercise shares: Python's warnings never reach stderr from a rank; ``quiet`` puts
    descriptor 2 itself on /dev/null while the target runs (gloo's C++ messages); a record without "forbidden"
    gets False, one that says True keeps it."""
    found = observe_on_ranks(0, CASES, _noisy, None, quiet=quiet)
    ranks = {name: s["ranks"] for name, s in found["scenarios"].items()}
    assert [r["forbidden"] for r in ranks["plain"]] == [False, False]
    assert [r["forbidden"] for r in ranks["forbidden"]] == [True, True]
    assert all((r["stderr"] == "/dev/null") == quiet for rs in ranks.values() for r in rs)
    err = capfd.readouterr().err
    assert "a rank's warning" not in err
    assert ("a rank's own line on stderr" in err) != quiet


# ---- several scenarios in one launch (``together``) ------------------------------------------------

def _sums_with_pid(rank: int, world_size: int, fn, case: dict) -> dict:
    """The student's function all-reduces the rank's number (twice on rank 0 in a deadlock scenario); says which
    process answered."""
    import os

    from autograder.exercises.beside.ranks import student_call

    if case.get("raise"):
        raise ValueError("this scenario fails")
    value = student_call(fn, float(rank + case["x"]), bool(case.get("deadlock") and rank == 0))
    return {"sum": value, "pid": os.getpid()}


SUM_CELL = """import torch
import torch.distributed as dist

def total(v, twice):
    t = torch.tensor([v])
    if twice:
        dist.all_reduce(t.clone())  # the other ranks never call this one
    dist.all_reduce(t)
    return t.item()
"""


def _only_first_in_its_process(rank: int, world_size: int, fn, case: dict) -> dict:
    """Fails when an earlier scenario ran in the same process: a failure that a shared launch, not the student's
    code, would cause."""
    import os

    if os.environ.get("A_SCENARIO_RAN") and case.get("fragile"):
        raise RuntimeError("state left by an earlier scenario")
    os.environ["A_SCENARIO_RAN"] = "1"
    return {"pid": os.getpid(), "x": fn(case["x"])}


def _cases(*extras: dict) -> dict:
    return {f"s{i}": {"what": f"scenario {i}", "world_size": 2, "x": i, **extra} for i, extra in enumerate(extras)}


def _double():
    return Deferred([("your cell", "def double(v):\n    return 2 * v\n")], "double")


def _total():
    return Deferred([("your cell", SUM_CELL)], "total")


def test_scenarios_of_one_world_size_share_a_launch_with_the_same_results_as_alone():
    cases = {**_cases({}, {}, {}), "wide": {"what": "on 3 ranks", "world_size": 3, "x": 5}}
    together = observe_on_ranks(0, cases, _sums_with_pid, _total(), together=lambda case: True)["scenarios"]
    alone = observe_on_ranks(0, cases, _sums_with_pid, _total())["scenarios"]
    for key in cases:
        assert [r["sum"] for r in together[key]["ranks"]] == [r["sum"] for r in alone[key]["ranks"]], key
        assert all(r["forbidden"] is False for r in together[key]["ranks"])
    assert len({together[k]["ranks"][0]["pid"] for k in ("s0", "s1", "s2")}) == 1  # one launch for world size 2
    assert len({alone[k]["ranks"][0]["pid"] for k in ("s0", "s1", "s2")}) == 3
    # a scenario with gates or judged peaks keeps its own launch (and its own meter)
    apart = observe_on_ranks(0, _cases({}, {}), _sums_with_pid, _total(), together=lambda case: True,
                             peaks=lambda case: case["x"] == 1)["scenarios"]
    assert apart["s0"]["ranks"][0]["pid"] != apart["s1"]["ranks"][0]["pid"]


def test_a_scenario_that_fails_after_others_in_a_shared_launch_is_judged_at_the_head_of_a_launch_of_its_own():
    """Its failure is recorded only where it failed first in its processes, as alone: a failure that only the
    scenarios before it caused is not the student's (it passes alone), and the scenarios after it still run."""
    cases = _cases({}, {"fragile": True}, {})
    found = in_launches(lambda calls: run_in_one_launch(_only_first_in_its_process, 2, calls, group=False),
                        [(_double(), c) for c in cases.values()])
    assert all("ranks" in f for f in found), found
    assert [f["ranks"][0]["x"] for f in found] == [0, 2, 4]
    pids = [f["ranks"][0]["pid"] for f in found]
    assert pids[0] != pids[1] == pids[2]  # the fragile one ran again first in a fresh launch; the next shared it


def test_errors_and_deadlocks_in_a_shared_launch_cost_only_their_own_scenario():
    cases = _cases({}, {"raise": True}, {}, {"deadlock": True}, {})
    found = observe_on_ranks(0, cases, _sums_with_pid, _total(), timeout=3.0,
                             together=lambda case: True)["scenarios"]
    assert found["s1"]["error"] == "ValueError: this scenario fails"
    assert found["s3"]["error"] == observe_on_ranks(0, {"s3": cases["s3"]}, _sums_with_pid, _total(),
                                                    timeout=3.0)["scenarios"]["s3"]["error"]
    assert [found[k]["ranks"][0]["sum"] for k in ("s0", "s2", "s4")] == [1.0, 5.0, 9.0]
    # answered before a failure in the same ranks: run again, so that the meter they carry is whole
    assert all(None not in found[k]["meter"]["maxrss_kib"] for k in ("s0", "s2", "s4"))
