"""An exercise whose own method uses a library the others forbid (Lesson 9's checkpoints import FSDP's modules) is
graded in a worker of its own, where that library alone is left in place; every other exercise keeps every stub.
Whether ranks share /tmp is the worker's choice per task (an exercise whose ranks share files), not a kind of worker."""
from types import SimpleNamespace

import pytest
from submission_factory import reference_source

from autograder.authoring.course import load_course
from autograder.grader import isolation
from autograder.grader.messages import Task
from autograder.grader.runner import close_idle_workers, run_tasks
from autograder.grader.sandbox import forbidden
from autograder.grader.sandbox.launch import Limits, Sandbox, make_sandbox

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
    needs = {"A": (), "B": (FSDP,), "C": (), "D": (FSDP,)}
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
    assert set(results) == {"nb::A", "nb::B", "nb::C", "nb::D"}
    by_exercises = {tuple(exercises): binds for exercises, binds in workers}
    assert set(by_exercises) == {("A", "C"), ("B", "D")}  # B's ranks share files, D's do not: one worker
    assert any(FSDP in target for target in by_exercises[("A", "C")])
    assert not any(FSDP in target for target in by_exercises[("B", "D")])
    assert isolated == {("A", "C"): True, ("B", "D"): True}  # the sandbox's; B's launcher leaves its ranks together
    assert [len(made.stubs.binds) for made in isolation.worker_kinds(["A", "B", "C", "D"], sandbox)] == \
        [len(by_exercises[("A", "C")]), len(by_exercises[("B", "D")])]


SEES = ("\nimport os as _os\nopen(f'/tmp/seen-{_os.getpid()}', 'w').close()\n"
        "print('SEEN', len([n for n in _os.listdir('/tmp') if n.startswith('seen-')]))\n")


@pytest.mark.slow
def test_one_worker_keeps_one_exercises_ranks_together_and_isolates_the_others():
    """Checkpointer's ranks share /tmp (a checkpoint is one folder); FlightRecorder's, graded by the same worker
    (both need the FSDP modules), each get a /tmp of their own: the worker's launcher decides per task."""
    sandbox = make_sandbox(gpu=False)
    if sandbox.mode != "bubblewrap" or not sandbox.isolate_ranks:
        pytest.skip(f"no bubblewrap sandbox with isolated ranks here: {sandbox.describe()}")
    setup = tuple(("setup", c) for c in load_course().spec_for_exercise("Checkpointer").setup_code)
    tasks = [Task(e, e, setup + (("cell", reference_source(e) + SEES),), 150.0, 0)
             for e in ("Checkpointer", "FlightRecorder")]
    [(group, made)] = list(isolation.by_worker(tasks, sandbox))
    try:
        results, _ = run_tasks(group, made)
    finally:
        close_idle_workers()
    seen = {}
    for key, result in results.items():
        assert result.status == "ok", result
        seen[key] = [int(line.split()[1]) for line in result.output.splitlines() if line.startswith("SEEN ")]
    assert seen["FlightRecorder"] and set(seen["FlightRecorder"]) == {1}, seen  # each rank sees its own file only
    assert max(seen["Checkpointer"]) > 1, seen  # the ranks' files in one /tmp
