"""Observing ``Checkpointer`` on real ranks: trained, killed from outside, cut off and resumed on another world size.

Before: the ranks train with the student's checkpointer, saving after every step and stopping at the grader's gate
after each save. The launcher's answer there (one seed for every rank) weighs the samples of the next step, so the
state a checkpoint holds follows from the seeds of the saves before it, which only the killed run was given: no
``load()`` can rebuild it by replaying the training from the case's seeds. The launcher snapshots the directory at
the gate before the chosen save and, once every rank has reached the gate after it, kills them all (SIGKILL). That
killed run serves both resumed scenarios: each gets the directory as the kill left it, at the same path (a
checkpoint may name its own folder), and the one that says so has the newest save cut back to what a kill in the
middle of it leaves (``plan_cut``, planned once on the killed run's own files). After: a fresh model on the
scenario's number of ranks calls ``load()`` and trains to the end; each rank answers its own rows of the state,
which the launcher joins. The model is sharded the way FSDP2 shards it (every parameter a DTensor split by rows
over the ranks, each layer gathered in one collective), by the grader's own code: the grader's sandbox switches
torch's FSDP off. The run that never failed (what the checks compare with) is recomputed by the launcher itself for
each killed run, under the same seeds, with plain tensors (``never_failed``: no ranks, and no student code): the
resumed runs train their later steps with seeds the launcher drew after the kill.
"""
import functools
import math
import os
import shutil
import signal
import tempfile
import warnings
from pathlib import Path

import torch
import torch._dynamo  # noqa: F401  torch.optim imports it lazily (seconds): here, once, not per rank
import torch.distributed as dist
import torch.distributed.device_mesh  # noqa: F401  the same for DTensor's modules: imported in the launcher, a
import torch.distributed.tensor  # noqa: F401  rank's memory grows by what it allocates, not by what it imports
import torch.utils.serialization  # noqa: F401  torch.save and torch.load import it lazily: in every rank otherwise
from torch import nn

from coursekit.failures import ShuffledBatches

from ..beside import warm_sharding
from ..beside.gating import factors, step_seed
from ..beside.meter import GatePolicy
from ..beside.observing import float32_data, observation, plain
from ..beside.ranks import ask_gate, run_on_ranks, student_call
from .cases import GLOBAL_BATCH, LR, ROWS, cases, expected_step

LAUNCH_S = 25  # one launch; a correct one takes about a second, several on a loaded 2-core machine
MAX_FILES, MAX_SNAPSHOT_BYTES = 512, 16 << 20  # what the grader reads back of a student's checkpoint directory


# ---- the grader's model, data and step -------------------------------------------------------------

class ShardedMLP(nn.Module):
    """Linear layers with Tanh between, every parameter a DTensor sharded by rows (Shard(0)) over the ranks, as
    FSDP2 keeps them. As FSDP2 does for a group of layers, each forward gathers a group whole in one collective,
    and its backward sums the group's gradient over the ranks in one, each rank keeping its own rows (``Gathered``):
    the small model is one group (two collectives a step), the memory scenario's large layers one group each (as
    FSDP2 wraps large layers: a rank holds one layer's whole gradient at a time)."""

    def __init__(self, sizes, mesh, per_layer: bool = False):
        from torch.distributed.tensor import Shard, distribute_tensor

        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        for layer in self.layers:
            for name, p in list(layer.named_parameters()):
                setattr(layer, name, nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)], src_data_rank=None)))
        self.groups = [[layer] for layer in self.layers] if per_layer else [list(self.layers)]

    def forward(self, x):
        return mlp(x, (pair for group in self.groups for pair in self.gathered(group)))

    @staticmethod
    def gathered(group):
        """The group's layers whole, as (weight, bias) pairs."""
        params = [p for layer in group for p in (layer.weight, layer.bias)]
        rank, world_size = dist.get_rank(), dist.get_world_size()
        whole = Gathered.apply(tuple(tuple(p.shape) for p in params),
                               tuple(row_range(p.shape[0], world_size, rank) for p in params),
                               *(p.to_local() for p in params))
        return zip(whole[::2], whole[1::2])


class Gathered(torch.autograd.Function):
    """Tensors of the given ``shapes`` whole on every rank, from each rank's rows of them (``rows``, one range per
    tensor): one all-reduce, to which each rank brings its rows and zeros elsewhere (a sum with zeros is exact).
    Backward: the whole gradients summed over the ranks in one all-reduce, of which each rank keeps its rows (a
    reduce-scatter; two ranks' sum is the same in either order). One collective each way for a group instead of
    one per parameter (DTensor's redistribute), which cost a rank most of its step."""

    @staticmethod
    def forward(ctx, shapes: tuple, rows: tuple, *local):
        ctx.shapes, ctx.rows = shapes, rows
        flat = local[0].new_zeros(sum(math.prod(shape) for shape in shapes))
        whole = split(flat, shapes)
        for tensor, mine, (start, stop) in zip(whole, local, rows):
            tensor[start:stop] = mine
        dist.all_reduce(flat)
        return whole

    @staticmethod
    def backward(ctx, *grads):
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        dist.all_reduce(flat)
        # copies of the rows: a view would keep the whole gradient alive in the parameter's .grad
        return None, None, *(t[start:stop].clone() for t, (start, stop) in zip(split(flat, ctx.shapes), ctx.rows))


def split(flat, shapes) -> tuple:
    """``flat`` as consecutive tensors of ``shapes`` (views)."""
    return tuple(part.view(shape) for part, shape in zip(flat.split([math.prod(s) for s in shapes]), shapes))


def row_range(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """The rows of ``rows`` that rank ``rank`` holds, as Shard(0) splits them (torch.chunk: ceil(rows / world_size)
    a rank, the last ones fewer or none)."""
    chunk = -(-rows // world_size)
    return min(rank * chunk, rows), min((rank + 1) * chunk, rows)


def mlp(x, layers):
    """Linear layers with Tanh between, each given as its (whole) weight and bias."""
    for i, (weight, bias) in enumerate(layers):
        x = nn.functional.linear(torch.tanh(x) if i else x, weight, bias)
    return x


def new_run(case: dict):
    """What a fresh process builds from the seeds: model, optimizer and loader; the RNG seeded the same on every
    rank (so every rank draws the same random numbers, and one saved state serves any world size)."""
    seed_cpu(case["model_seed"])
    model = ShardedMLP(case["sizes"], warm_sharding.device_mesh(dist.get_world_size()), per_layer=case["memory"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)  # DTensor ops: one a step, fused
    return model, optimizer, new_loader(case)


def new_loader(case: dict) -> ShuffledBatches:
    """The seeded data; then torch's RNG seeded for the steps' random numbers."""
    x = torch.randn(ROWS, case["sizes"][0], generator=torch.Generator().manual_seed(case["data_seed"]))
    loader = ShuffledBatches(x, x.sum(1, keepdim=True).sin(), GLOBAL_BATCH, seed=case["data_seed"])
    seed_cpu(case["data_seed"] + 1)
    return loader


def seed_cpu(seed: int) -> None:
    """torch.manual_seed for the CPU, the only device here: torch.manual_seed also queues a seed for each other
    device, formatting the stack every time (milliseconds in a fresh rank)."""
    torch.default_generator.manual_seed(seed)


def train_step(model, optimizer, loader, seed: int | None = None) -> list[float]:
    """One step on this rank's rows of the global batch, weighted by random numbers drawn for the whole batch (the
    part of a step that reads the RNG: dropout, augmentation) and, after a gate, by factors in [0.5, 1.5) drawn
    from ``seed`` (its own generator: torch's RNG is not touched); returns what it read (sums of batch and noise)."""
    x, y, weights, read = next_batch(loader, seed)
    optimizer.zero_grad()
    rank_loss(model, x, y, weights, dist.get_rank(), dist.get_world_size()).backward()
    optimizer.step()
    return read


def next_batch(loader, seed: int | None):
    """The step's batch, its weights, and what it read."""
    x, y = loader.next_batch()
    noise = torch.rand(len(x))
    weights = noise if seed is None else noise * factors(seed, noise)
    return x, y, weights, [float(x.double().sum()), float(noise.double().sum())]


def rank_loss(model, x, y, weights, rank: int, world_size: int):
    """Rank ``rank``'s part of the step's loss: its rows of the batch (every ``world_size``-th from ``rank``)."""
    mine = slice(rank, None, world_size)
    return ((model(x[mine]) - y[mine]).square().mean(1) * weights[mine]).sum() / GLOBAL_BATCH


def own_rows(model, optimizer, moments: bool = True) -> dict:
    """This rank's rows of every parameter and, with ``moments``, of both AdamW moments (zeros where AdamW holds
    none yet), a float32 list each; AdamW's step count. No collective: the launcher joins the ranks' rows
    (``whole_state``)."""
    params = list(model.parameters())
    return rows_of([p.detach().to_local() for p in params], [optimizer.state.get(p, {}) for p in params], moments)


def rows_of(params: list, states: list[dict], moments: bool) -> dict:
    """``own_rows`` of local tensors ``params`` and their AdamW states (DTensors or tensors)."""
    rows, steps = {"params": [], "moments": []}, []
    for p, state in zip(params, states):
        rows["params"].append(float32_data(p.flatten()))
        for name in ("exp_avg", "exp_avg_sq") if moments else ():
            moment = state.get(name)
            local = moment.to_local() if hasattr(moment, "to_local") else moment
            rows["moments"].append(float32_data(local.flatten()) if moment is not None else [0.0] * p.numel())
        steps.append(float(state["step"]) if "step" in state else 0.0)
    return {**rows, "adam_step": max(steps, default=0.0)}


def whole_state(rows: list[dict]) -> dict:
    """The ranks' ``own_rows`` (in rank order, as Shard(0) splits a tensor) joined: every parameter and, where
    there, both AdamW moments whole, as a gather gives them, each kind in one list; rank 0's step count."""
    def joined(key: str) -> list[float]:
        return [v for i in range(len(rows[0][key])) for r in rows for v in r[key][i]]

    return {"params": joined("params"), "moments": joined("moments"), "adam_step": rows[0]["adam_step"]}


def trained_digest(model) -> list[float]:
    """The sum and the sum of squares of every parameter, over all ranks: what the seeded training made."""
    local = torch.zeros(2, dtype=torch.float64)
    for p in model.parameters():
        t = p.detach().to_local().double().flatten()
        local += torch.stack([t.sum(), t.dot(t)])  # no squared copy: the memory scenario's ranks fault less
    dist.all_reduce(local)
    return local.tolist()


def quiet():
    warnings.simplefilter("ignore")  # a rank's warnings would reach the notebook's stderr, and so would
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # gloo's own abort message on mismatched collectives


# ---- inside the ranks ------------------------------------------------------------------------------

def seed_of(case: dict, answers: list, step: int) -> int | None:
    """The seed of step ``step + 1``'s weights: the launcher's answer at the gate after save ``step`` (none for the
    first step, nor in the memory scenario, which has no gates)."""
    answer = answers[step - 1] if 0 < step <= len(answers) else None
    return None if answer is None else step_seed(case["data_seed"], answer)


def before_rank(rank: int, world_size: int, cls, case: dict, directory: str) -> dict:
    """Train from nothing with the student's checkpointer; the grader's gate after every save (killed at one), whose
    answer weighs the next step."""
    quiet()
    model, optimizer, loader = new_run(case)
    checkpointer = student_call(cls, directory, model, optimizer, loader)
    found = student_call(checkpointer.load)
    answers = []
    for step in range(case["steps"]):
        train_step(model, optimizer, loader, seed_of(case, answers, step))
        student_call(checkpointer.save, step + 1)
        answers.append(ask_gate("saved", torch.tensor([float(step + 1)])))
    return {"forbidden": False, "load_on_empty": plain(found), "trained": trained_digest(model)}


def after_rank(rank: int, world_size: int, cls, case: dict, directory: str, answers: list) -> dict:
    """A fresh process on the new world size: load(), then train to the end (without saving: no check reads a save
    of the resumed run, and saves were most of its time). ``answers``: the launcher's seeds for the steps after the
    newest complete save (None before it: a rank that resumes from an older step trains with other weights, as it
    would with other data). Each rank answers its own rows of the state after load() and at the end, which the
    launcher joins (``joined_ranks``): no gather."""
    quiet()
    model, optimizer, loader = new_run(case)
    checkpointer = student_call(cls, directory, model, optimizer, loader)
    found = student_call(checkpointer.load)
    start = found if isinstance(found, int) and 0 <= found <= case["steps"] else 0
    loaded = own_rows(model, optimizer)
    read = []
    for step in range(start, case["steps"]):
        read.append(train_step(model, optimizer, loader, seed_of(case, answers, step)))
    return {"forbidden": False, "loaded": plain(found), "after_load": loaded, "read": read if rank == 0 else [],
            "final": own_rows(model, optimizer, moments=False)}


def joined_ranks(found: dict) -> dict:
    """``after_rank``'s records with the ranks' rows joined into rank 0's (``whole_state``), the others' dropped; a
    record without them (a failed run, or rows that do not join) as it came."""
    try:
        ranks = found["ranks"]
        after_load, final = whole_state([r["after_load"] for r in ranks]), whole_state([r["final"] for r in ranks])
        others = [{k: r[k] for k in ("forbidden", "loaded")} for r in ranks[1:]]
    except (KeyError, TypeError, IndexError):
        return found
    return {**found, "ranks": [{**ranks[0], "after_load": after_load, "final": final["params"]}, *others]}


# ---- the launcher's side: the run that never failed; kill, cut off, measure the directory -----------

def rank_rows(t, world_size: int) -> list:
    """``t``'s rows on each rank (``row_range``)."""
    return [t[slice(*row_range(len(t), world_size, rank))] for rank in range(world_size)]


def never_failed(case: dict, answers: list, keep: list[int], moments: list[int]) -> dict:
    """The run that never failed, on the first world size, under the seeds ``answers``: what it read each step, and
    its state after each step in ``keep`` (``whole_state``), AdamW's moments only after those in ``moments``.

    Recomputed here in the launcher with plain tensors, no ranks: each rank's rows of every parameter with an AdamW
    of its own over them, its part of the batch through the layers the rows make together (the forward's
    all-gather), and its rows of the gradient summed over the ranks (the backward's reduce-scatter). These are the
    ranks' own ops on the ranks' own shapes, and a sum of two numbers is the same in either order, so on two ranks
    (every killed run's) this is their run bit for bit (tests/exercises/test_checkpointer.py compares them)."""
    world_size, sizes = case["killed_on"], case["sizes"]
    with torch.random.fork_rng():
        seed_cpu(case["model_seed"])
        whole = [p.detach() for a, b in zip(sizes, sizes[1:]) for p in nn.Linear(a, b).parameters()]
        shards = [[nn.Parameter(rank_rows(p, world_size)[rank].clone()) for p in whole] for rank in range(world_size)]
        optimizers = [torch.optim.AdamW(own, lr=LR, fused=True) for own in shards]
        loader = new_loader(case)

        def state(step: int) -> dict | None:
            if step not in keep:
                return None
            return whole_state([rows_of(own, [optimizer.state.get(p, {}) for p in own], moments=step in moments)
                                for own, optimizer in zip(shards, optimizers)])

        read, states = [], [state(0)]
        for step in range(case["steps"]):
            x, y, weights, what = next_batch(loader, seed_of(case, answers, step))
            grads = []
            for rank in range(world_size):
                gathered = [torch.cat([own[i].detach() for own in shards]).requires_grad_() for i in range(len(whole))]
                layers = list(zip(gathered[::2], gathered[1::2]))
                loss = rank_loss(lambda x: mlp(x, layers), x, y, weights, rank, world_size)
                grads.append(torch.autograd.grad(loss, gathered))
            for i in range(len(whole)):
                summed = functools.reduce(torch.add, [g[i] for g in grads])
                for rank, own in enumerate(shards):
                    own[i].grad = rank_rows(summed, world_size)[rank].clone()
            for optimizer in optimizers:
                optimizer.step()
            read.append(what)
            states.append(state(step + 1))
    return {"read": read, "states": states}


def snapshot(directory: Path, contents: bool) -> dict:
    """Every regular file under ``directory`` (symbolic links and others ignored): its inode, size and times, and
    with ``contents`` its bytes (up to a limit)."""
    found, budget = {}, MAX_SNAPSHOT_BYTES
    for root, _, files in os.walk(directory):
        for name in files:
            path = Path(root) / name
            try:
                st = os.lstat(path)
                if not path.is_file() or path.is_symlink() or len(found) >= MAX_FILES:
                    continue
                data = None
                if contents and st.st_size <= budget:
                    data, budget = path.read_bytes(), budget - st.st_size
                found[str(path.relative_to(directory))] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, data)
            except OSError:
                continue
    return found


def plan_cut(directory: Path, before: dict) -> list[tuple[str, bytes | None, int | None]]:
    """How to make the newest save look as a kill in the middle of it leaves it: its last file operation (by change
    time) never happened (a file it created is gone, one it renamed over an older file is the older file again, one
    it wrote in place holds its first half), and the file it wrote just before, the one the kill interrupted, holds
    only its first half. Per file: (path, the bytes it goes back to or None, the size it is cut to or None)."""
    now = snapshot(directory, contents=False)
    changed = sorted((p for p in now if p not in before or before[p][:4] != now[p][:4]),
                     key=lambda p: (now[p][3], now[p][2]))
    plan = []
    for p in changed[-2:]:
        replaced = p not in before or before[p][0] != now[p][0]  # a new inode: created, or renamed into place
        if p == changed[-1] and replaced:
            plan.append((p, before[p][4] if p in before else None, None))
        else:
            plan.append((p, None, now[p][1] // 2))
    return plan


def apply_cut(directory: Path, plan) -> None:
    for p, older, size in plan:
        path = directory / p
        try:
            if size is not None:
                os.truncate(path, size)
            else:
                path.unlink()
                if older is not None:
                    path.write_bytes(older)
        except OSError:
            pass


def cut_off(directory: Path, before: dict) -> None:
    apply_cut(directory, plan_cut(directory, before))


def disk_bytes(directory: Path) -> int:
    return sum(v[1] for v in snapshot(directory, contents=False).values())


class KillAfterSave(GatePolicy):
    """Every rank waits at each gate (after each save) until all have reached it, and is answered one seed for every
    rank (the next step's weights). At the gate after save ``kill_after - 1`` the directory is snapshot; at the gate
    after save ``kill_after`` every rank is killed. A rank that asks more often than it saves is refused there."""

    def __init__(self, world_size: int, kill_after: int, directory: Path, steps: int):
        super().__init__(world_size, gates=steps, shared=True)
        self.kill_after, self.directory = kill_after, directory
        self.waiting: dict[int, set[int]] = {}
        self.before, self.killed = {}, False

    def request(self, rank: int, request, meter) -> list[tuple[int, float]]:
        index = self.record(rank, request, meter)
        if index is None:
            return self.refuse(rank)
        arrived = self.waiting.setdefault(index, set())
        arrived.add(rank)
        if len(arrived) < self.world_size:
            return []
        del self.waiting[index]
        saved = index + 1
        if saved == self.kill_after - 1:
            self.before = snapshot(self.directory, contents=True)
        if saved == self.kill_after:
            for pid in meter.pids:
                os.kill(pid, signal.SIGKILL)  # from outside, as a node failure would
            self.killed = True
            return []
        return [(r, self.answer(r, index)) for r in sorted(arrived)]


class KilledRun:
    """The run the grader killed: its directory as the kill left it (a copy, put back at the same path for each
    scenario that resumes from it) and the cut planned on its own files; or why there is none. ``answers``: the
    seeds of every gate after a save, those the killed ranks were answered and, from the kill on, seeds drawn after
    it; ``never_failed``: the grader's run under them (recomputed by the launcher itself: ``never_failed``)."""

    def __init__(self, cls, case: dict, directory: Path):
        self.directory, self.kept = directory, directory.with_name(directory.name + "-as-killed")
        policy = KillAfterSave(case["killed_on"], case["kill_after"], directory, case["steps"])
        found = run_on_ranks(before_rank, case["killed_on"], cls, case, str(directory), gates=policy,
                             timeout=LAUNCH_S)
        self.failed = None if policy.killed and not any(policy.refused) else (
            found if "error" in found else {"error": "the ranks ended before the grader's kill"} if not policy.killed
            else {"error": "the ranks asked the grader's gate after a save more often than they saved"})
        if self.failed:
            return
        self.cut = plan_cut(directory, policy.before)
        shutil.copytree(directory, self.kept, symlinks=True)
        self.answers = [float(policy.answer(0, i)) for i in range(case["steps"] - 1)]
        # the states the checks compare with: after the first step, at either resume (as killed, after the cut), last;
        # AdamW's moments only at a resume (check_optimizer)
        resumes = sorted({case["kill_after"] - 1, case["kill_after"]})
        keep = sorted({1, *resumes, case["steps"]})
        self.never_failed = never_failed(case, self.answers, keep, resumes)

    def resume(self, cls, case: dict) -> dict:
        if self.failed:
            return self.failed
        shutil.rmtree(self.directory, ignore_errors=True)
        shutil.copytree(self.kept, self.directory, symlinks=True)
        if case["cut_off"]:
            apply_cut(self.directory, self.cut)
        start = expected_step(case)
        later = [None] * (start - 1) + self.answers[max(start - 1, 0):]  # only the seeds after the newest save
        found = joined_ranks(run_on_ranks(after_rank, case["world_size"], cls, case, str(self.directory), later,
                                          timeout=LAUNCH_S))
        truth = self.never_failed
        compared = {"read": truth["read"], "first": truth["states"][1]["params"], "at_resume": truth["states"][start],
                    "final": truth["states"][-1]["params"]}
        return {**found, "meter": {**found.get("meter", {}), "never_failed": compared}}

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        shutil.rmtree(self.kept, ignore_errors=True)


def run_scenario(cls, case: dict, killed: dict) -> dict:
    """One scenario; ``killed`` keeps the killed runs (by what they were: ranks, kill step), so that scenarios
    resuming from the same one share it."""
    if case["memory"]:
        directory = Path(tempfile.mkdtemp(prefix="checkpointer-"))
        try:
            found = run_on_ranks(before_rank, case["killed_on"], cls, case, str(directory), peaks=True,
                                 timeout=LAUNCH_S)
            return {**found, "disk_bytes": disk_bytes(directory)} if "ranks" in found else found
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    key = (case["killed_on"], case["kill_after"], case["model_seed"], case["data_seed"])
    if key not in killed:
        directory = Path(tempfile.mkdtemp(prefix="checkpointer-"))
        try:
            killed[key] = KilledRun(cls, case, directory)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
    return killed[key].resume(cls, case)


def preload() -> None:
    """DCP's modules, imported in the launcher as well (where they import: torch's own FSDP, which they need, may
    be switched off), so that every launcher's ranks start from the same imports and their memory compares."""
    try:
        import torch.distributed.checkpoint  # noqa: F401
        import torch.distributed.checkpoint.state_dict  # noqa: F401
    except ImportError:
        pass
    try:  # what DCP's first save or load imports (fsspec and its plugins' entry points): once, not in every rank
        import torch.distributed.checkpoint._fsspec_filesystem  # noqa: F401
    except ImportError:
        pass


def warm_up(case: dict) -> None:
    """The grader's own training, state dicts and load, run once in the launcher on a fake group
    (beside/warm_sharding.py)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, optimizer, loader = new_run(case)
    train_step(model, optimizer, loader)  # a second step computes nothing new
    model_state, optim_state = get_state_dict(model, optimizer)
    if case["memory"]:  # the only ranks that end by themselves; they load nothing
        trained_digest(model)
    else:
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)


def warm_runs(cases) -> dict[int, list[dict]]:
    """World size: one case per model for each world size a case runs on (killed, resumed)."""
    runs = {(size, tuple(case["sizes"])): case for case in cases for size in (case["killed_on"], case["world_size"])}
    return {size: [case for (s, _), case in runs.items() if s == size] for size in sorted({s for s, _ in runs})}


def observe(fn, *, salt: int = 0) -> dict:
    preload()
    killed, scenarios = {}, cases(salt)
    warm_sharding.warm(warm_runs(scenarios.values()), warm_up)
    try:
        return observation(salt, scenarios, lambda case: run_scenario(fn, case, killed))
    finally:
        for run in killed.values():
            run.remove()


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    for observed in result["scenarios"].values():
        if "ranks" not in observed:
            raise RuntimeError(f"the reference Checkpointer failed when {observed['case']['what']}: {observed['error']}")
    return result
