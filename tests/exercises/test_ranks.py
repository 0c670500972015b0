"""The launcher of the grader's scenarios (exercises/beside/ranks.py), on its own."""
import pytest

from autograder.exercises.beside.ranks import Deferred, observe_on_ranks, run_on_ranks


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


def _crashes_once(rank: int, world_size: int, fn, case: dict) -> dict:
    """Rank 1 dies of a segmentation fault in the first launch (``case["flag"]`` not there yet), or in every one: a
    real one, a read of address 0. (A whole-suite run once saw the rank live on after sending itself SIGSEGV: a sent
    signal can be blocked, or caught and returned from, by what the test process inherited; a fault cannot.)"""
    import ctypes
    from pathlib import Path

    flag = Path(case["flag"])
    if rank == 1 and (case["always"] or not flag.exists()):
        flag.touch()
        ctypes.string_at(0)
    return {"launch": "again" if flag.exists() else "first"}


@pytest.mark.parametrize("together", [False, True])
@pytest.mark.parametrize("always", [False, True])
def test_a_scenario_whose_rank_crashes_gets_one_more_launch(tmp_path, always, together):
    """A crash in native code (torch's profiler in a forked rank, rarely) costs a scenario one more launch, not the
    student's points; a crash that repeats stands, as the student's own would. Launches run together too (the
    second one alone)."""
    cases = {"crashing": {"world_size": 2, "flag": str(tmp_path / "crashed"), "always": always}}
    found = observe_on_ranks(0, cases, _crashes_once, None, quiet=True, together=together)["scenarios"]["crashing"]
    if always:
        assert found["error"] == "rank 1 died without a result (signal SIGSEGV)"
    else:
        assert [r["launch"] for r in found["ranks"]] == ["again", "again"]


def _meets_the_others(rank: int, world_size: int, fn, case: dict) -> dict:
    """Says it is here (a file), waits until every scenario's rank 0 is (so the launches run at the same time), then
    reports its port and the pipes it holds: its own (``rank_fds``) and all it has open."""
    import os
    import time
    from pathlib import Path

    from autograder.exercises.beside.ranks import rank_fds

    here = Path(case["folder"])
    if rank == 0:
        (here / case["name"]).touch()
    end = time.monotonic() + 30
    while len(list(here.iterdir())) < case["scenarios"] and time.monotonic() < end:
        time.sleep(0.01)

    def pipes(fds):
        links = []
        for fd in fds:
            try:
                links.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return sorted(link for link in links if link.startswith("pipe:"))

    if case.get("fails"):
        raise RuntimeError("this scenario's own failure")
    return {"port": os.environ["MASTER_PORT"], "met": len(list(here.iterdir())), "own": pipes(rank_fds()),
            "open": pipes(int(fd) for fd in os.listdir("/proc/self/fd"))}


def test_launches_run_together_each_on_its_own(tmp_path):
    """``together``: every scenario's ranks run at the same time (each rank 0 meets the others'), each launch with
    its own store port and its result in its own place, a failure its own scenario's alone; no rank holds a pipe of
    another launch's ranks (the launcher's ends, open while the later launches fork, are closed in them)."""
    names = ("a", "b", "c")
    cases = {name: {"world_size": 2, "folder": str(tmp_path), "name": name, "scenarios": len(names),
                    "fails": name == "b"} for name in names}
    found = observe_on_ranks(0, cases, _meets_the_others, None, quiet=True, together=True)["scenarios"]
    assert found["b"]["error"] == "RuntimeError: this scenario's own failure"
    ranks = {name: found[name]["ranks"] for name in ("a", "c")}
    assert all(r["met"] == len(names) for rs in ranks.values() for r in rs)
    assert len({rs[0]["port"] for rs in ranks.values()}) == 2
    for name, rs in ranks.items():
        assert rs[0]["port"] == rs[1]["port"]
        others = {pipe for other, them in ranks.items() if other != name for r in them for pipe in r["own"]}
        assert all(r["own"] and not others & set(r["open"]) for r in rs), (name, rs, others)
