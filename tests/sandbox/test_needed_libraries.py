"""An exercise whose own method uses a library the others forbid (Lesson 9's checkpoints import FSDP's modules) is
graded in a worker of its own, where that library alone is left in place, and ranks whose method shares files get a
worker whose ranks share /tmp; every other exercise keeps every stub and one /tmp per rank."""
from types import SimpleNamespace

from autograder.grader import isolation
from autograder.grader.messages import Task
from autograder.grader.sandbox import forbidden
from autograder.grader.sandbox.launch import Limits, Sandbox

FSDP = "torch/distributed/fsdp"
DDP = "torch/nn/parallel/distributed.py"


def test_the_stubs_without_a_library_keep_every_other_one():
    stubs = forbidden.locate()
    assert any(target.endswith("/" + FSDP) for _, target in stubs.binds)
    kept = stubs.without((FSDP,))
    assert not any(FSDP in target for _, target in kept.binds)
    assert len(kept.binds) == len(stubs.binds) - 1
    no_ddp = stubs.without((DDP,))
    assert not any("/nn/parallel/distributed" in target or "/nn/parallel/__pycache__/distributed." in target
                   for _, target in no_ddp.binds)  # the file and its compiled copies
    assert stubs.without(()) == stubs


def test_tasks_that_need_a_library_run_in_a_worker_of_their_own(monkeypatch):
    needs = {"A": (), "B": (FSDP,), "C": ()}
    monkeypatch.setattr(isolation, "get_exercise", lambda name: SimpleNamespace(
        needs_libraries=needs[name], ranks=False, ranks_share_files=name == "B"))
    workers, isolated = [], {}

    def run_tasks(tasks, sandbox, **_):
        workers.append(([t.exercise for t in tasks], [target for _, target in sandbox.stubs.binds]))
        isolated[tuple(t.exercise for t in tasks)] = sandbox.isolate_ranks
        return {t.key: None for t in tasks}, 1.0

    monkeypatch.setattr(isolation, "run_tasks", run_tasks)
    sandbox = Sandbox("off", Limits(), None, stubs=forbidden.locate(), isolate_ranks=True)
    tasks = [Task(f"nb::{name}", name, (), 10.0, 0) for name in needs]
    results, _ = isolation.run_isolated(tasks, sandbox)
    assert set(results) == {"nb::A", "nb::B", "nb::C"}
    by_exercises = {tuple(exercises): binds for exercises, binds in workers}
    assert set(by_exercises) == {("A", "C"), ("B",)}
    assert any(FSDP in target for target in by_exercises[("A", "C")])
    assert not any(FSDP in target for target in by_exercises[("B",)])
    assert isolated == {("A", "C"): True, ("B",): False}
