"""Lesson 9, section 4: a training job that survives losing a rank. Started by torchrun, e.g.

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 elastic_train.py --dir ckpt --steps 8 --pause-at 4

Each step all-reduces the gradients of a replicated model, then saves a distributed checkpoint into
``ckpt/step_N`` (torch.distributed.checkpoint writes ``.metadata`` last, so a directory without it is incomplete).
Every (re)start loads the newest complete checkpoint. ``train_step(..., rank=0, world_size=1)`` outside torchrun is
the run that never failed, for comparison. On its first attempt the job pauses after step ``--pause-at``
so that the notebook can kill a rank from outside; torchrun then restarts the whole group.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from coursekit.failures import latest_complete, step_dir

GLOBAL_BATCH, WIDTH = 8, 16


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, 32), nn.Tanh(), nn.Linear(32, 1))


def batch(step: int):
    """The global batch of step ``step``, the same in every process and for every world size."""
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, WIDTH, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def make_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=0.01)


def train_step(model, optimizer, step, rank, world_size):
    x, y = batch(step)
    mine = slice(rank, None, world_size)  # my rows of the global batch
    loss = ((model(x[mine]) - y[mine]) ** 2).sum() / GLOBAL_BATCH
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():
        if world_size > 1:
            dist.all_reduce(p.grad)  # the sum over ranks = the gradient of the global batch's mean
    optimizer.step()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--pause-at", type=int, default=-1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # torchrun's store outlives a failed attempt: a prefix per attempt keeps the dead group's addresses out of it
    store, rank, world_size = next(dist.rendezvous("env://"))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store), rank=rank,
                            world_size=world_size)
    with open(os.path.join(args.dir, f"pid_rank{rank}_attempt{attempt}"), "w") as f:
        f.write(str(os.getpid()))
    model = make_model()
    optimizer = make_optimizer(model)
    start, found = 0, latest_complete(args.dir)
    if found:
        start, path = found
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=path)  # resharded to this world size by DCP
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if rank == 0:
        print(f"attempt {attempt}: {world_size} ranks, resuming at step {start}", flush=True)
    for step in range(start, args.steps):
        train_step(model, optimizer, step, rank, world_size)
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=step_dir(args.dir, step + 1))
        if attempt == 0 and step + 1 == args.pause_at:
            time.sleep(60)  # a slow step: the notebook kills a rank now
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()},
                   os.path.join(args.dir, "final.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
