"""Observing ``BucketedDDP`` on real ranks: a seeded training loop, instrumented by the grader."""

import torch
import torch._dynamo  # noqa: F401  torch.optim and DDP import it lazily (3–6 s): here, once, not in every forked rank
import torch.distributed as dist
from torch import nn

from ..beside.gating import GradientGate, in_launcher, pause_at_gates, replay
from ..beside.meter import OverlapGates
from ..beside.observing import float32_data, projections
from ..beside.ranks import digest, observe_on_ranks, run_on_ranks, student_call
from .cases import BATCH, EXTRA, HIDDEN, HOLD, LAYER_BYTES, LAYERS, LR, MOMENTUM, OVERLAP_BATCH, VOCAB, WIDTH, cases


class TokenNet(nn.Module):
    """A tiny next-token model. ``special``: a frozen bias, a layer forward never uses, head tied to the embedding."""

    def __init__(self, special: bool):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.hidden1 = nn.Linear(HIDDEN, HIDDEN)
        self.hidden2 = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)
        if special:
            self.head.weight = self.embed.weight        # tied: one Parameter, used twice in forward
            self.hidden1.bias.requires_grad_(False)     # frozen: its .grad stays None
            self.unused = nn.Linear(HIDDEN, EXTRA)      # never called: its .grad stays None too

    def forward(self, tokens):
        h = torch.tanh(self.hidden1(self.embed(tokens)))
        return self.head(torch.tanh(self.hidden2(h)))


def make_model(c: dict, rank: int = 0) -> TokenNet:
    """The seeded model; with ``different_init`` every rank starts from its own weights (rank 0's must win)."""
    torch.manual_seed(c["model_seed"] + (rank if c["different_init"] else 0))
    return TokenNet(c["model"] == "special")


def local_batch(c: dict, rank: int, step: int):
    """Rank ``rank``'s tokens and targets for ``step``: a shard of one seeded batch shared by all ranks."""
    generator = torch.Generator().manual_seed(c["data_seed"] + step)
    n = BATCH * c["world_size"]
    tokens = torch.randint(0, VOCAB, (n,), generator=generator)
    targets = (tokens * 3 + torch.randint(0, 2, (n,), generator=generator)) % VOCAB
    return tokens[rank::c["world_size"]], targets[rank::c["world_size"]]


def make_optimizer(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def params_of(model) -> list[float]:
    return [v for p in model.parameters() for v in float32_data(p)]


def grads_of(model) -> list:
    return [float32_data(p.grad) if p.grad is not None else None for p in model.parameters()]


# ---- the grader's instrumentation inside a rank --------------------------------------------------

class WatchedWork:
    """What the student's asynchronous all-reduce returned, with its ``wait()`` logged."""

    def __init__(self, work, on_wait):
        self._work, self._on_wait = work, on_wait

    def wait(self, *args, **kwargs):
        self._on_wait()
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):  # get_future, is_completed, ...: the real object's
        return getattr(self._work, name)


class Instrument:
    """Logs gradients becoming ready, all-reduces issued and waited for; notices torch's own DDP being built.

    Installed in a forked rank only (the patches die with it). It wraps the process group's ``allreduce``,
    which ``dist.all_reduce`` calls however the student imported it (torch's DDP calls it from C++ instead).
    """

    def __init__(self):
        self.events, self.issued, self.wrapped_ddp = [], 0, False
        original_all_reduce = dist.ProcessGroup.allreduce
        original_ddp_init = nn.parallel.DistributedDataParallel.__init__

        def all_reduce(group, tensors, *args, **kwargs):
            k, self.issued = self.issued, self.issued + 1
            sizes = tensors if isinstance(tensors, (list, tuple)) else [tensors]
            self.events.append(["issue", k, sum(int(t.numel()) for t in sizes)])
            work = original_all_reduce(group, tensors, *args, **kwargs)
            # dist.all_reduce waits at once unless async_op=True: a synchronous call logs its wait right here
            return WatchedWork(work, lambda: self.events.append(["wait", k])) if work is not None else work

        def ddp_init(ddp, *args, **kwargs):
            self.wrapped_ddp = True
            original_ddp_init(ddp, *args, **kwargs)

        dist.ProcessGroup.allreduce = all_reduce
        nn.parallel.DistributedDataParallel.__init__ = ddp_init

    def watch_gradients(self, model):
        """Registered before the student's hooks, so each gradient's "ready" comes before what they launch."""
        for i, p in enumerate(model.parameters()):
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda _, i=i: self.events.append(["ready", i]))

    def take(self) -> list:
        events, self.events = self.events, []
        return events


def gated_model(c: dict) -> nn.Sequential:
    """LAYERS × (Linear, Tanh), a grader's gate after each layer but the last: the same weights on every rank."""
    torch.manual_seed(c["model_seed"])
    layers = []
    for i in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()] + ([GradientGate()] if i < LAYERS - 1 else [])
    return nn.Sequential(*layers)


def overlap_input(c: dict, rank: int) -> torch.Tensor:
    return torch.randn(OVERLAP_BATCH, WIDTH, generator=torch.Generator().manual_seed(c["data_seed"] + rank))


def grad_evidence(grads: list, c: dict) -> list:
    """Each gradient as [sum, sum of squares, two projections] (``observing.projections``, drawn from the scenario's
    seed): the projections see an average that is right only to 16 bits, which the sum does not."""
    return [None if g is None else digest(g) + p for g, p in zip(grads, projections(grads, c["data_seed"]))]


def expected_gates(c: dict):
    """The launcher's recomputation (meter.GatePolicy.expect): each rank's local backward through the gated stack,
    its gates answered with the seeds it was given, and the average over ranks of their gradients (what every rank
    must hold after finish_gradient_synchronization), as digests."""
    def expect(seeds: list[list[int]]) -> dict:
        digests, grads, model = [], [], gated_model(c)  # rank 0's weights, on every rank after __init__
        for rank, rank_seeds in enumerate(seeds):
            x = overlap_input(c, rank)
            model.zero_grad(set_to_none=True)
            digests.append(replay(lambda: model(x).square().mean().backward(), rank_seeds))
            grads.append([p.grad for p in model.parameters()])
        average = [torch.stack(per_rank).mean(0) for per_rank in zip(*grads)]
        return {"digests": digests, "grads": grad_evidence(average, c)}
    return in_launcher(expect)


def overlap_rank(rank: int, world_size: int, cls, c: dict) -> dict:
    """Two steps through the gated stack; in the second the launcher holds and measures the ranks at the gates
    (OverlapGates).
    Recorded here: each parameter's averaged gradient as a digest, and the event log (for feedback only)."""
    instrument = Instrument()
    model = gated_model(c)
    instrument.watch_gradients(model)
    wrapped = student_call(cls, model, c["bucket_size_mb"])
    instrument.take()
    x = overlap_input(c, rank)
    for step in range(2):  # measured in the second step: a wrapper's state must carry over between steps
        pause_at_gates(step == 1)
        model.zero_grad(set_to_none=True)
        instrument.take()
        loss = student_call(wrapped, x).square().mean()
        student_call(loss.backward)  # the student's hooks, and the grader's gates, run in here
        instrument.events.append(["backward done"])
        student_call(lambda: wrapped.finish_gradient_synchronization())
    return {"forbidden": instrument.wrapped_ddp, "grads": grad_evidence([p.grad for p in model.parameters()], c),
            "events": instrument.take()}


def gates_of(c: dict):
    if c["model"] != "gated":
        return None
    return OverlapGates(c["world_size"], hold=HOLD, bucket_bytes=LAYER_BYTES // 2, gates=LAYERS - 1,
                        expect=expected_gates(c))


def student_rank(rank: int, world_size: int, cls, c: dict) -> dict:
    """One rank of a data-parallel training loop with the student's wrapper, instrumented."""
    if c["model"] == "gated":
        return overlap_rank(rank, world_size, cls, c)
    instrument = Instrument()
    model = make_model(c, rank)
    instrument.watch_gradients(model)
    wrapped = student_call(cls, model, c["bucket_size_mb"])
    instrument.take()  # whatever __init__ did is not a step's communication
    after_init = params_of(model) if c["different_init"] else None  # only where ranks start apart
    optimizer = make_optimizer(model.parameters())
    steps = []
    for step in range(c["steps"]):
        tokens, targets = local_batch(c, rank, step)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(student_call(wrapped, tokens), targets)
        student_call(loss.backward)  # the student's hooks run in here
        instrument.events.append(["backward done"])
        student_call(lambda: wrapped.finish_gradient_synchronization())
        steps.append({"grads": grads_of(model), "events": instrument.take()})
        optimizer.step()
    return {"forbidden": instrument.wrapped_ddp, "after_init": after_init, "steps": steps,
            "final": params_of(model), "names": [name for name, _ in model.named_parameters()]}


def ddp_rank(rank: int, world_size: int, c: dict) -> dict | None:
    """The same training with torch's DistributedDataParallel: the ground truth (rank 0's; every rank holds the
    same averaged gradients and parameters)."""
    model = make_model(c, rank)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=c["bucket_size_mb"],
                                              find_unused_parameters=c["model"] == "special")
    optimizer = make_optimizer(ddp.parameters())
    grads = []
    for step in range(c["steps"]):
        tokens, targets = local_batch(c, rank, step)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(tokens), targets).backward()
        grads.append(grads_of(model))
        optimizer.step()
    return {"grads": grads, "final": params_of(model)} if rank == 0 else None


def observe(fn, *, salt: int = 0) -> dict:
    return observe_on_ranks(salt, cases(salt), student_rank, fn, gates=gates_of)


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    result["ddp"] = {}
    for name, scenario_ in result["scenarios"].items():
        if scenario_["case"]["model"] == "gated":
            continue  # the reference's own gated run is the measure there
        ddp = run_on_ranks(ddp_rank, scenario_["case"]["world_size"], scenario_["case"], timeout=60)
        if "error" in ddp:
            raise RuntimeError(f"DDP itself failed in scenario {name}: {ddp['error']}")
        result["ddp"][name] = ddp["ranks"][0]
    return result
