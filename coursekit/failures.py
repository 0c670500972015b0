"""Lesson 9's plumbing for surviving failures: every RNG's state, a data loader that knows its position, atomic
publishing of a checkpoint, finding the newest complete one, and the arithmetic of how often to checkpoint.

The teaching happens in the notebook; these are the pieces it reuses and the elastic script imports.
"""
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

COMPLETE = ".metadata"  # torch.distributed.checkpoint writes this file last, after every rank's shards


def rng_state() -> dict:
    """Every generator a training step may draw from: Python's, torch's CPU one and each GPU's."""
    state = {"python": random.getstate(), "cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


class ShuffledBatches:
    """Batches of (x, y) in a new seeded order each epoch, with a position to save: resuming mid-epoch continues
    with the next unseen batch instead of starting the epoch again."""

    def __init__(self, x, y, batch_size: int, seed: int = 0):
        self.x, self.y, self.batch_size, self.seed = x, y, batch_size, seed
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        return len(self.x) // self.batch_size

    def next_batch(self):
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        rows = order[self.position * self.batch_size:(self.position + 1) * self.batch_size]
        self.position += 1
        if self.position == len(self):
            self.epoch, self.position = self.epoch + 1, 0
        return self.x[rows], self.y[rows]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


def publish(obj, path) -> None:
    """Save ``obj`` so that ``path`` always holds a complete file: write a temporary file beside it, flush it to
    disk, then rename it over ``path`` (a rename within a file system is atomic) and flush the directory entry."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def step_dir(root, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def latest_complete(root) -> tuple[int, Path] | None:
    """The newest ``step_N`` directory under ``root`` whose DCP metadata was written, or None: a directory without it
    was being written when its writer died."""
    found = [(int(p.name.split("_")[1]), p) for p in Path(root).glob("step_*") if (p / COMPLETE).is_file()]
    return max(found) if found else None


class PausingFile:
    """A file that, after ``pause_after`` bytes, says so on ``signal`` (a multiprocessing connection) and then
    writes slowly: a writer with a slow disk, so that a kill lands in the middle of its write every time."""

    def __init__(self, path, pause_after: int, signal):
        self.file, self.pause_after, self.signal, self.written = open(path, "wb"), pause_after, signal, 0

    def write(self, data) -> int:
        if self.written >= self.pause_after and self.signal is not None:
            self.signal.send("paused")
            self.signal = None
            time.sleep(60)  # the parent kills us here
        self.written += len(data)
        self.file.write(data)
        self.file.flush()
        return len(data)

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def young_daly_interval(checkpoint_cost: float, mtbf: float) -> float:
    """The work between checkpoints that minimises expected lost time, √(2 · C · MTBF) (Young 1974, Daly 2006),
    in the units of its arguments."""
    return math.sqrt(2 * checkpoint_cost * mtbf)


def simulate_overhead(interval: float, checkpoint_cost: float, mtbf: float, work: float, restart_cost: float,
                      seed: int) -> float:
    """Wall time over useful work, minus one, of a run that checkpoints after every ``interval`` of work and fails
    at exponentially distributed times (mean ``mtbf``): a failure loses the work since the last complete checkpoint
    and costs ``restart_cost`` to come back."""
    rng = random.Random(seed)
    done = wall = 0.0
    while done < work:
        segment = min(interval, work - done) + checkpoint_cost
        failure = rng.expovariate(1 / mtbf)
        if failure >= segment:
            done, wall = done + segment - checkpoint_cost, wall + segment
        else:
            wall += failure + restart_cost
    return wall / work - 1


def torchrun(script, directory, *, nproc: int, max_restarts: int = 0, args=()) -> subprocess.Popen:
    """Start ``script`` under torchrun on this machine; its output is captured (read it with ``stop_job``).
    torchrun's own logs go into ``directory`` too (left to itself it makes a new folder in /tmp every run)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               f"--max-restarts={max_restarts}", "--log-dir", str(Path(directory) / "torchrun-logs"),
               str(script), "--dir", str(directory), *map(str, args)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition, job: subprocess.Popen, timeout: float) -> bool:
    """Poll ``condition()`` until it holds, the job ends or ``timeout`` seconds pass; say whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.poll() is None:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def stop_job(job: subprocess.Popen, pid_dir, timeout: float) -> tuple[int, str, str]:
    """Wait for a torchrun job; past ``timeout`` stop its agent (which stops its ranks) and kill any rank whose pid
    file in ``pid_dir`` names a process still alive and still running with ``--dir pid_dir`` (a pid may have been
    reused), so that nothing is left behind. Returns (code, out, err)."""
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.terminate()
        try:
            out, err = job.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            job.kill()
            out, err = job.communicate()
    for pid_file in Path(pid_dir).glob("pid_*"):
        try:
            pid = int(pid_file.read_text())
            if str(pid_dir) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0"):
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass  # already gone, as it should be
    return job.returncode, out, err
