"""coursekit.failures: the pieces Lesson 9 and its elastic script rely on, each checked by what it does."""
import os
import random
import signal
from multiprocessing import get_context

import pytest
import torch

from coursekit.failures import (
    COMPLETE,
    PausingFile,
    ShuffledBatches,
    latest_complete,
    publish,
    rng_state,
    set_rng_state,
    simulate_overhead,
    step_dir,
    young_daly_interval,
)


def test_rng_state_brings_back_every_generator():
    state = rng_state()
    first = (random.random(), torch.rand(3))
    set_rng_state(state)
    again = (random.random(), torch.rand(3))
    assert first[0] == again[0] and torch.equal(first[1], again[1])


def test_a_loader_resumed_from_its_state_continues_with_the_next_unseen_batch():
    x = torch.arange(20.0).unsqueeze(1)
    whole = ShuffledBatches(x, x, batch_size=4, seed=3)
    seen = [whole.next_batch()[0] for _ in range(8)]  # crosses an epoch boundary
    stopped = ShuffledBatches(x, x, batch_size=4, seed=3)
    for _ in range(3):
        stopped.next_batch()
    resumed = ShuffledBatches(x, x, batch_size=4, seed=3)
    resumed.load_state_dict(stopped.state_dict())
    assert all(torch.equal(resumed.next_batch()[0], want) for want in seen[3:])
    assert sorted(torch.cat(seen[:5]).flatten().tolist()) == x.flatten().tolist()  # an epoch sees every row once


def _kill_halfway(path, atomic):
    context = get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def writer():
        torch.set_num_threads(1)  # a forked child of a process that used torch's threads
        target = path.with_name(path.name + ".partial") if atomic else path
        torch.save({"step": 2, "w": torch.ones(2**20)}, PausingFile(target, pause_after=2**20, signal=send))
        if atomic:
            os.replace(target, path)

    child = context.Process(target=writer)
    child.start()
    try:
        assert receive.poll(60), f"the writer never reached the middle of its write (exit code {child.exitcode})"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()


@pytest.mark.parametrize("atomic", [False, True])
def test_only_a_published_checkpoint_survives_a_kill_in_the_middle_of_a_save(tmp_path, atomic):
    path = tmp_path / "checkpoint.pt"
    publish({"step": 1, "w": torch.zeros(2**20)}, path)
    _kill_halfway(path, atomic)
    if atomic:
        assert torch.load(path)["step"] == 1
    else:
        with pytest.raises(RuntimeError):
            torch.load(path)


def test_latest_complete_skips_a_directory_without_metadata(tmp_path):
    assert latest_complete(tmp_path) is None
    for step in (1, 2, 10):
        step_dir(tmp_path, step).mkdir()
        if step != 10:
            (step_dir(tmp_path, step) / COMPLETE).write_bytes(b"")
    assert latest_complete(tmp_path) == (2, step_dir(tmp_path, 2))


def test_the_simulated_waste_is_least_near_youngs_interval():
    cost, mtbf = 5.0, 2000.0
    young = young_daly_interval(cost, mtbf)
    assert young == pytest.approx((2 * cost * mtbf) ** 0.5)

    def waste(tau):
        return sum(simulate_overhead(tau, cost, mtbf, 20_000, 20, seed) for seed in range(8)) / 8

    assert waste(young) < waste(young / 8) and waste(young) < waste(young * 8)
    assert simulate_overhead(100, 0, 1e12, 1000, 0, seed=0) == 0  # no cost, (almost) no failures: no waste


def test_torchrun_keeps_its_logs_in_the_job_directory(tmp_path, monkeypatch):
    """Left to itself torchrun makes a torchelastic_* folder in /tmp on every run, and Lesson 9 runs it twice."""
    from coursekit.failures import stop_job, torchrun

    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    script = tmp_path / "job.py"
    script.write_text("import sys\nprint('ran with', sys.argv[1:])\n")
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    code, out, err = stop_job(torchrun(script, job_dir, nproc=1), job_dir, timeout=60)
    assert code == 0, err[-2000:]
    assert "ran with" in out
    assert not list((tmp_path / "tmp").glob("torchelastic_*"))
    assert (job_dir / "torchrun-logs").is_dir()
