"""Data-parallel training of the digits classifier with DistributedDataParallel.

The same ``train`` function runs in two ways:

* from the Lesson 3 notebook, in forked local ranks: ``coursekit.dist.launch(train, 2)``;
* as a script, one process per rank started by ``torchrun``::

      torchrun --nproc-per-node 2 ddp_train.py              # one machine, 2 ranks
      # two machines (run on each; HOST is the first machine's address):
      torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
               --rdzv-id my-job ddp_train.py

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every process it starts;
``coursekit.dist.run_under_torchrun`` reads them, picks NCCL when every local rank has a GPU (else gloo),
and forms the process group. Each rank prints one JSON line: who it is and what it trained.
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from coursekit.data import digits, mlp
from coursekit.dist import run_under_torchrun


def load_data(path: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The digits: from a saved (X, y) file when given (as a job reads prepared data), else from scikit-learn."""
    return torch.load(path) if path else digits()


def train(rank: int, world_size: int, steps: int = 30, batch_per_rank: int = 32, lr: float = 0.1,
          seed: int = 0, data: str | None = None) -> dict:
    """Train ``steps`` DDP steps of ``batch_per_rank`` samples per rank; return a summary of this rank."""
    local_rank = int(os.environ.get("LOCAL_RANK", rank))  # on several machines, rank ≠ local rank
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")

    X, y = load_data(data)
    dataset = TensorDataset(X, y)
    # Every rank sees a different 1/world_size of each epoch: the same seeded shuffle, then every N-th index.
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed,
                                 drop_last=True)
    loader = DataLoader(dataset, batch_size=batch_per_rank, sampler=sampler, drop_last=True)

    # DDP broadcasts rank 0's weights at construction, so every rank starts identical.
    model = DistributedDataParallel(mlp(64, seed=seed).to(device), device_ids=[local_rank] if on_gpu else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    criterion = nn.CrossEntropyLoss()

    step, epoch, loss = 0, 0, torch.zeros((), device=device)
    start = time.perf_counter()
    while step < steps:
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = criterion(model(xb.to(device)), yb.to(device))
            loss.backward()  # DDP all-reduces the gradients during backward
            optimizer.step()
            step += 1
            if step == steps:
                break
        epoch += 1
    if on_gpu:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start

    mean_loss = loss.detach().reshape(1).clone()
    dist.all_reduce(mean_loss)  # each rank's last loss is on its own shard: report the average
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    return {"rank": rank, "world_size": world_size, "local_rank": local_rank,
            "node": int(os.environ.get("GROUP_RANK", 0)), "host": socket.gethostname(), "pid": os.getpid(),
            "backend": dist.get_backend(), "device": str(device), "steps": steps,
            "last_loss": mean_loss.item() / world_size, "param_checksum": checksum,
            "samples_per_s": steps * batch_per_rank * world_size / seconds}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-per-rank", type=int, default=32)
    parser.add_argument("--data", help="a torch.save'd (X, y) pair (default: load the digits with scikit-learn)")
    args = parser.parse_args()
    result = run_under_torchrun(train, args.steps, args.batch_per_rank, 0.1, 0, args.data)
    # One write per line: ranks share the terminal, and a single small write is not interleaved with another's.
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
