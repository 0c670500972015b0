"""The capstone recipe: data parallelism (DDP or FSDP2) + mixed precision + gradient accumulation,
with checkpoints that resume exactly, on the digits.

The same ``train`` runs in two ways:

* from the Lesson 6 notebook, in forked ranks: ``coursekit.dist.launch(train, 2, Recipe(...))``;
* as a script, one process per rank started by ``torchrun``::

      torchrun --nproc-per-node 2 capstone.py --precision bf16 --accumulation 4 \
               --checkpoint /tmp/digits.ckpt --checkpoint-every 10
      # interrupt it (Ctrl-C) after a checkpoint and run the same command again: it resumes

What makes resuming exact: the data a step uses is a pure function of the step number (no data-loader state
to save), and the checkpoint holds everything else the next step reads — weights, optimizer moments, learning
rate schedule, loss scale, and every rank's random-number generators (dropout: the CPU's, and on a GPU
the GPU's).
"""
import argparse
import contextlib
import gc
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from coursekit.data import digits, mlp
from coursekit.dist import my_device, run_under_torchrun
from coursekit.memory import profile_memory

N_TRAIN = 1500  # the first 1,500 digits train; the last 297 are held out
LOW_PRECISION = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Recipe:
    wrapper: str = "ddp"       # "ddp" or "fsdp2"
    precision: str = "fp32"    # "fp32", "bf16" (autocast) or "fp16" (autocast + GradScaler)
    accumulation: int = 1      # micro-batches per optimizer step
    micro_batch: int = 64      # samples per micro-batch per rank
    steps: int = 60            # optimizer steps
    lr: float = 1e-2
    hidden: int = 256
    seed: int = 0

    def global_batch(self, world_size: int) -> int:
        return world_size * self.accumulation * self.micro_batch


_DIGITS = []


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The digits, loaded once per process; ranks forked after a first call inherit them (no re-import)."""
    if not _DIGITS:
        _DIGITS.extend(digits())
    return _DIGITS[0], _DIGITS[1]


def step_samples(step: int, recipe: Recipe, world_size: int) -> torch.Tensor:
    """Indices of the training samples optimizer step ``step`` uses: a new seeded shuffle every epoch."""
    per_step = recipe.global_batch(world_size)
    epoch, position = divmod(step, N_TRAIN // per_step)
    order = torch.randperm(N_TRAIN, generator=torch.Generator().manual_seed(recipe.seed * 1000 + epoch))
    return order[position * per_step:(position + 1) * per_step]


def wrap(model: nn.Module, recipe: Recipe, device: torch.device) -> nn.Module:
    model = model.to(device)
    if recipe.wrapper == "ddp":
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)  # one FSDP unit per layer: gathered just before it runs
    return fully_shard(model, mesh=mesh)


def gradient_sync(model: nn.Module, on: bool):
    """Skip the gradient all-reduce on all but the last micro-batch (Lesson 3's no_sync, for both wrappers)."""
    if isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext() if on else model.no_sync()
    model.set_requires_gradient_sync(on)
    return contextlib.nullcontext()


def make_training(recipe: Recipe, device: torch.device, wrapper=wrap):
    model = wrapper(mlp(recipe.hidden, dropout=0.1, seed=recipe.seed), recipe, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)
    warmup = max(1, recipe.steps // 10)  # linear warm-up, then cosine decay to 10 %
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(s, recipe.steps) / recipe.steps))))
    scaler = torch.amp.GradScaler(device.type, enabled=recipe.precision == "fp16")
    return model, optimizer, schedule, scaler


def train_window(micro_batches, divisor, recipe, model, optimizer, schedule, scaler, X, y, device) -> float:
    """One optimizer step over a window of micro-batches (index tensors); each loss is divided by ``divisor``.

    ``divisor`` is the window's length for the mean over the window; Accelerate always divides by its
    ``gradient_accumulation_steps``, also for a final window that is shorter. Returns the mean loss.
    """
    dtype = LOW_PRECISION[recipe.precision]
    total = 0.0
    for j, idx in enumerate(micro_batches):
        last = j == len(micro_batches) - 1
        with gradient_sync(model, on=last):
            with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = nn.functional.cross_entropy(model(X[idx]), y[idx])
            scaler.scale(loss / divisor).backward()  # fp32 master weights, fp32 gradients
        total += loss.item()
    scaler.unscale_(optimizer)  # true gradients before clipping; fp16's scale would distort the norm
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(optimizer)  # skipped (and the scale halved) if an fp16 gradient overflowed
    scaler.update()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    return total / len(micro_batches)


def train_step(step, recipe, model, optimizer, schedule, scaler, X, y, device) -> float:
    """Optimizer step ``step``: this rank's ``accumulation`` micro-batches; returns this rank's mean loss."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = step_samples(step, recipe, world_size).view(world_size, recipe.accumulation, recipe.micro_batch)[rank]
    return train_window(mine, recipe.accumulation, recipe, model, optimizer, schedule, scaler, X, y, device)


def rng_state(device: torch.device) -> dict:
    """This rank's random generators: the CPU's, and its GPU's when it trains on one (dropout on a GPU draws there)."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore what ``rng_state`` saved."""
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(path: Path, step: int, model, optimizer, schedule, scaler) -> None:
    """Every rank takes part (the state may be sharded); rank 0 writes one file, atomically."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # the whole model, gathered to rank 0
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    rng = [None] * dist.get_world_size()
    dist.all_gather_object(rng, rng_state(my_device()))  # every rank's dropout stream
    if dist.get_rank() == 0:
        state = {"step": step, "model": model_state, "optimizer": optim_state, "schedule": schedule.state_dict(),
                 "scaler": scaler.state_dict(), "rng": rng}
        partial = path.with_suffix(".partial")
        torch.save(state, partial)
        os.replace(partial, path)  # a crash while writing never leaves a half-written checkpoint behind
    dist.barrier()


def load_checkpoint(path: Path, model, optimizer, schedule, scaler) -> int:
    """Restore everything ``save_checkpoint`` wrote; return the step to continue from."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=StateDictOptions(full_state_dict=True))
    schedule.load_state_dict(state["schedule"])
    scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"][dist.get_rank()], my_device())
    return state["step"]


def flat_parameters(model) -> torch.Tensor:
    """All weights as one CPU vector, gathered from the shards if needed (every rank must call this)."""
    model_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return torch.cat([t.detach().float().cpu().flatten() for t in model_state.values()])


def train(rank: int, world_size: int, recipe: Recipe, checkpoint: str | None = None, checkpoint_every: int = 0,
          stop_after: int | None = None, progress=None, measure_memory: bool = False) -> dict:
    """Train ``recipe`` (resuming from ``checkpoint`` if it exists); stop early after ``stop_after`` steps.

    ``progress``: anything with tqdm's ``update(n)``; ``measure_memory``: also run one more step under the
    memory profiler, after the results are taken, and report its peak above the resting state.
    """
    device = my_device()  # the GPU of this machine's local rank (the global rank may name none)
    X, y = (t.to(device) for t in load_digits())
    model, optimizer, schedule, scaler = make_training(recipe, device)
    torch.manual_seed(recipe.seed * 1000 + rank)  # each rank its own dropout masks
    path = Path(checkpoint) if checkpoint else None
    start = load_checkpoint(path, model, optimizer, schedule, scaler) if path and path.exists() else 0
    end = recipe.steps if stop_after is None else min(recipe.steps, stop_after)
    if progress is not None and rank == 0 and start:
        progress.update(start)  # the bar counts steps of the whole run, the resumed ones included

    losses, timed_from = [], None
    for step in range(start, end):
        if step == start + 1:  # the first step pays one-off costs (DDP's bucket rebuild, allocations)
            timed_from = time.perf_counter()
        losses.append(train_step(step, recipe, model, optimizer, schedule, scaler, X, y, device))
        if path and checkpoint_every and (step + 1) % checkpoint_every == 0:
            save_checkpoint(path, step + 1, model, optimizer, schedule, scaler)
        if progress is not None and rank == 0:
            progress.update(1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - timed_from if timed_from else float("nan")

    model.eval()  # dropout off for the test
    with torch.no_grad():
        correct = (model(X[N_TRAIN:]).argmax(1) == y[N_TRAIN:]).float().mean()
    last = torch.tensor([sum(losses[-5:]) / max(1, len(losses[-5:]))], device=device)
    dist.all_reduce(last)  # the loss averaged over ranks (each saw different samples)
    params = flat_parameters(model)
    peak = None
    if measure_memory:
        model.train()
        gc.collect()  # garbage from earlier work, freed during the measurement, would confuse the profiler
        peak, _ = profile_memory(lambda: train_step(end, recipe, model, optimizer, schedule, scaler, X, y, device),
                                 device)
    return {"rank": rank, "steps": end - start, "loss": last.item() / world_size, "test accuracy": correct.item(),
            "samples/s": (end - start - 1) * recipe.global_batch(world_size) / seconds,
            "loss scale": scaler.get_scale() if scaler.is_enabled() else None, "peak bytes": peak,
            "params": params.numpy() if rank == 0 else None}  # numpy: a tensor would be sent as shared memory


def one_epoch_order(recipe: Recipe, n_samples: int) -> torch.Tensor:
    """A seeded shuffle of ``n_samples`` training digits: the epoch both loops below walk through."""
    return torch.randperm(N_TRAIN, generator=torch.Generator().manual_seed(recipe.seed))[:n_samples]


def epoch_by_hand(rank: int, world_size: int, recipe: Recipe, n_samples: int, divide_by: str = "k") -> dict:
    """One epoch of ``recipe`` with this course's loop, over the micro-batches Accelerate would give this rank.

    Accelerate's DataLoader hands rank r the micro-batches r, r + N, r + 2N, ... of the epoch; the last window
    may be short. ``divide_by``: "k" divides its losses by ``accumulation`` as Accelerate does, "window" by
    its own length (the mean over the window).
    """
    device = my_device()
    X, y = (t.to(device) for t in load_digits())
    micro = one_epoch_order(recipe, n_samples).split(recipe.micro_batch)[rank::world_size]
    model, optimizer, schedule, scaler = make_training(recipe, device)
    torch.manual_seed(recipe.seed * 1000 + rank)  # each rank its own dropout masks
    k = recipe.accumulation
    windows = [micro[i:i + k] for i in range(0, len(micro), k)]
    for window in windows:
        train_window(window, k if divide_by == "k" else len(window), recipe, model, optimizer, schedule, scaler,
                     X, y, device)
    return {"params": flat_parameters(model).numpy(), "steps": len(windows), "last window": len(windows[-1])}


def epoch_with_accelerate(rank: int, world_size: int, recipe: Recipe, n_samples: int) -> dict:
    """The same epoch through Hugging Face Accelerate: its DataLoader sharding, ``accumulate``, ``backward``."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # else Accelerate picks a CPU thread count itself, with a warning
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    device = my_device()
    accelerator = Accelerator(cpu=device.type == "cpu", gradient_accumulation_steps=recipe.accumulation,
                              mixed_precision="no" if recipe.precision == "fp32" else recipe.precision)
    X, y = load_digits()
    order = one_epoch_order(recipe, n_samples)
    loader = DataLoader(TensorDataset(X[order], y[order]), batch_size=recipe.micro_batch,  # one process's view
                        generator=torch.Generator())  # its own: iterating draws a seed, not from dropout's stream
    model, optimizer, schedule, _ = make_training(recipe, device, wrapper=lambda m, r, d: m.to(d))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # DDP, autocast, sharded loader
    torch.manual_seed(recipe.seed * 1000 + rank)
    steps = 0
    for xb, yb in loader:
        with accelerator.accumulate(model):  # no_sync until the window is full (or the data ends)
            accelerator.backward(nn.functional.cross_entropy(model(xb), yb))  # loss / k inside
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()  # Accelerate's wrapper: does nothing until sync_gradients
            optimizer.zero_grad(set_to_none=True)
        if accelerator.sync_gradients:  # the schedule is ours, stepped once per optimizer step
            schedule.step()
            steps += 1
    return {"params": flat_parameters(model).numpy(), "steps": steps}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field, default in asdict(Recipe()).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(default), default=default)
    parser.add_argument("--checkpoint", default=None, help="file to save to and resume from")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    args = vars(parser.parse_args())
    checkpoint, every = args.pop("checkpoint"), args.pop("checkpoint_every")
    recipe = Recipe(**args)
    from tqdm import tqdm  # a terminal bar on rank 0; the notebook draws its own

    bar = tqdm(total=recipe.steps, desc=f"{recipe.wrapper} {recipe.precision} k={recipe.accumulation}",
               disable=os.environ.get("RANK", "0") != "0")
    result = run_under_torchrun(train, recipe, checkpoint, every, None, bar)
    bar.close()
    result.pop("params")
    sys.stdout.write(json.dumps(result) + "\n")
