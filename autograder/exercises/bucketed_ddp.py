"""Lesson 3 exercise: ``BucketedDDP(module, bucket_size_mb)``, data parallel with buckets and overlap.

The student's ``torch.nn.Module`` wraps a model on every rank of an initialised process group:
``__init__`` broadcasts rank 0's parameters and groups the trainable ones into buckets of about
``bucket_size_mb`` MiB; hooks fire as each gradient is accumulated during ``backward()`` and launch an
asynchronous all-reduce of a bucket as soon as all of its gradients are there;
``finish_gradient_synchronization()`` (after ``backward()``, before ``optimizer.step()``) waits for them
all and leaves every ``.grad`` holding the average over ranks.

The grader really runs it on 2 and 3 forked gloo ranks, training a tiny seeded token model for a few
steps with SGD + momentum, and records per step every rank's gradients after the call, and the final
parameters. Its own instrumentation in each rank (``Instrument``) logs, in order: each gradient becoming
ready (the grader's post-accumulate hooks, registered before the student's), each ``dist.all_reduce`` the
student issues (with its size), each ``wait()`` on what it returned (a synchronous call waits at once),
and the end of ``backward()``. The reference observation adds the same training done by
torch's ``DistributedDataParallel`` (``find_unused_parameters=True`` where a parameter is unused), which
the checks compare with.

Overlap is judged on that order of events, never on timings (deterministic on a loaded machine): an
overlapped implementation has all-reduces in flight (issued and not yet waited for) while later gradients
become ready. A synchronous all-reduce per bucket, one that waits at once, or one launched only after
``backward()`` has none. The counts earn points only with data evidence (the evidence rule): the first
step's averaged gradients point where DDP's do.

Wrapping torch's own ``DistributedDataParallel`` is not this exercise (the lesson says so): a submission
that constructs one earns nothing, with a sentence saying why.
"""
import warnings

import torch
import torch._dynamo  # noqa: F401  torch.optim and DDP import it lazily (3–6 s): here, once, not in every forked rank
import torch.distributed as dist
from torch import nn

from ..exercise import (
    Check,
    Exercise,
    ScenarioError,
    case,
    close,
    observation,
    parallel,
    run_on_ranks,
    salted_seed,
    scenario,
    student_call,
    what,
)

VOCAB, HIDDEN, EXTRA = 10, 8, 4     # token model: Embedding(VOCAB, HIDDEN) → 2 × Linear(HIDDEN, HIDDEN) → VOCAB
BATCH, STEPS = 6, 3                 # per-rank batch of tokens, optimizer steps
LR, MOMENTUM = 0.1, 0.9
MODEL_SEED, DATA_SEED = 4321, 77    # the public scenarios' seeds (salt 0)
LAUNCH_TIMEOUT_S = 8.0              # a correct scenario takes well under a second
GRAD_ATOL, PARAM_ATOL = 1e-6, 1e-5  # float32 round-off between valid styles (divide before or after, flat or not)
MIB = 1024 * 1024
ONE_BUCKET_MB = 1.0                 # the whole model is about 1 KiB: one bucket
PER_PARAM_MB = 1e-6                 # about 1 byte: smaller than any parameter, so one bucket per parameter
MID_MB = 288 / MIB                  # one Linear(8, 8) layer's weight and bias: several buckets of 1–2 parameters

SCENARIOS = {  # name: (world size, bucket MiB, model kind, ranks start from different weights?, what it is)
    "one_bucket": (2, ONE_BUCKET_MB, "plain", False, "called on 2 ranks with a bucket larger than the model"),
    "per_param": (2, PER_PARAM_MB, "plain", False,
                  "called on 2 ranks with a bucket smaller than any parameter (one bucket per parameter)"),
    "mid": (2, MID_MB, "plain", False, "called on 2 ranks with buckets of one or two parameters"),
    "three_ranks": (3, MID_MB, "plain", True, "called on 3 ranks that start from different weights"),
    "special": (2, MID_MB, "special", False,
                "the model has a frozen bias, an unused layer and tied weights (2 ranks)"),
}


def cases(salt: int) -> dict[str, dict]:
    """Every scenario's inputs; the seeds are public for salt 0 and held out for any other salt."""
    return {name: {"what": text, "world_size": world_size, "bucket_size_mb": bucket_mb, "model": kind,
                   "different_init": different, "steps": STEPS,
                   "model_seed": salted_seed(MODEL_SEED, salt), "data_seed": salted_seed(DATA_SEED, salt)}
            for name, (world_size, bucket_mb, kind, different, text) in SCENARIOS.items()}


# ---- the problem every rank trains ----------------------------------------------------------

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


def float32_data(t) -> list[float]:
    """A float32 tensor as plain floats with 9 significant digits: exactly its float32 values, in half the
    characters of ``tensor_data`` (the reference observation ships with the student kit)."""
    return [float(f"{v:.9g}") for v in t.detach().float().flatten().tolist()]


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


def student_rank(rank: int, world_size: int, cls, c: dict) -> dict:
    """One rank of a data-parallel training loop with the student's wrapper, instrumented."""
    warnings.simplefilter("ignore")  # a rank's warnings would reach the notebook's stderr
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
    return {"wrapped_ddp": instrument.wrapped_ddp, "after_init": after_init, "steps": steps,
            "final": params_of(model), "names": [name for name, _ in model.named_parameters()]}


def ddp_rank(rank: int, world_size: int, c: dict) -> dict | None:
    """The same training with torch's DistributedDataParallel: the ground truth (rank 0's; every rank holds the
    same averaged gradients and parameters)."""
    warnings.simplefilter("ignore")
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


# ---- observing: real processes ---------------------------------------------------------------

def observe(fn, *, salt: int = 0) -> dict:
    return observation(salt, cases(salt), lambda c: run_on_ranks(
        student_rank, c["world_size"], fn, c, timeout=LAUNCH_TIMEOUT_S))


def observe_reference(fn, *, salt: int = 0) -> dict:
    result = observe(fn, salt=salt)
    result["ddp"] = {}
    for name, scenario_ in result["scenarios"].items():
        ddp = run_on_ranks(ddp_rank, scenario_["case"]["world_size"], scenario_["case"], timeout=60)
        if "error" in ddp:
            raise RuntimeError(f"DDP itself failed in scenario {name}: {ddp['error']}")
        result["ddp"][name] = ddp["ranks"][0]
    return result


# ---- reading an observation (plain Python only: no torch from here on) -----------------------

def ranks_of(student: dict, reference: dict, key: str) -> list[dict]:
    """The scenario's per-rank records, or a ScenarioError with one sentence for the student."""
    try:
        ranks = scenario(student, key, what(reference, key))["ranks"]
    except ScenarioError as exc:
        if "missing the required" in str(exc):  # nn.Module's own NotImplementedError, not the blank exercise's
            raise ScenarioError("Your BucketedDDP has no forward method: define forward(self, *inputs, **kwargs) "
                                "that returns self.module(*inputs, **kwargs).") from None
        raise
    if any(r.get("wrapped_ddp") for r in ranks):
        raise ScenarioError("Your BucketedDDP builds torch's DistributedDataParallel: this exercise asks you to write "
                            "the buckets, hooks and all-reduces yourself (see the lesson), so it earns no points.")
    return ranks


def flat(grads) -> list:
    """Per-parameter gradient lists joined into one, None (no gradient) left out."""
    return [v for g in grads if g is not None for v in g] if isinstance(grads, list) else []


def scale_factor(got: list[float], want: list[float]) -> float | None:
    """c minimising |got − c·want| (how many times the average the student's gradient is)."""
    denominator = sum(w * w for w in want)
    return sum(g * w for g, w in zip(got, want)) / denominator if denominator else None


def gradient_problem(student: dict, reference: dict, key: str) -> str | None:
    """Whether every rank's gradients after every step equal DDP's, and its trained parameters too."""
    c = case(reference, key)
    n, when = c["world_size"], what(reference, key)
    ranks, truth = ranks_of(student, reference, key), reference["ddp"][key]
    names = ranks_of(reference, reference, key)[0]["names"]
    for step in range(c["steps"]):
        for rank, mine in enumerate(ranks):
            got, want = mine["steps"][step]["grads"], truth["grads"][step]
            where = f"When {when}, after step {step + 1} rank {rank}"
            for name, g, w in zip(names, got, want):
                if (g is None) != (w is None):
                    return (f"{where} has {'no' if g is None else 'a'} gradient for {name}, where DDP leaves "
                            f"{'one' if g is None else 'None'}: " + (
                                "every trained parameter must get its averaged gradient back." if g is None else
                                "leave .grad None for frozen and unused parameters (fill zeros only in the buffer)."))
            if close(flat(got), flat(want), atol=GRAD_ATOL, rtol=1e-4):
                continue
            factor = scale_factor(flat(got), flat(want))
            if factor is not None and abs(factor) < 1e-6 and close(flat(got), [0.0] * len(got), atol=GRAD_ATOL):
                return f"{where} holds zero gradients: .grad must hold the average over ranks."
            if factor is not None and close(flat(got), [factor * w for w in flat(want)], atol=GRAD_ATOL, rtol=1e-4):
                if abs(factor - n) < 1e-3:
                    return (f"{where} holds {n}× the average gradient: all_reduce sums, so divide by the world size "
                            "(once).")
                return f"{where} holds {factor:.3g}× the average gradient: divide the sum by the world size ({n})."
            wrong = [name for name, g, w in zip(names, got, want)
                     if g is not None and not close(g, w, atol=GRAD_ATOL, rtol=1e-4)]
            if any(not close(flat(other["steps"][step]["grads"]), flat(got), atol=GRAD_ATOL, rtol=1e-4)
                   for other in ranks):
                return (f"{where} holds a gradient other ranks do not (for {', '.join(wrong[:3])}): every bucket "
                        "must be all-reduced and copied back into .grad on every rank.")
            return (f"{where} holds the wrong gradient for {', '.join(wrong[:3])}: each must be copied back from its "
                    "own place in its bucket after that bucket's all-reduce has finished, the same buckets on every "
                    "rank.")
    if len(ranks) != n or not all(close(r["final"], truth["final"], atol=PARAM_ATOL) for r in ranks):
        return f"When {when}, the parameters after {c['steps']} steps differ from DistributedDataParallel's."
    return None


def averaged_for_real(got: dict, want: dict) -> str | None:
    """The evidence: on every rank the first step's gradients point the way the reference's averaged ones do
    (any scale). Only gradients really combined across ranks from the seeded data do that: a rank's own
    gradient, a constant or an invented observation does not."""
    mine, theirs = got["ranks"], want["ranks"]
    if len(mine) == len(theirs) and all(parallel(flat(m["steps"][0]["grads"]), flat(t["steps"][0]["grads"]))
                                        for m, t in zip(mine, theirs)):
        return None
    return (f"when {want['case']['what']}, the gradients after your finish_gradient_synchronization are not the "
            "ranks' gradients combined.")


def calls_per_step(ranks: list[dict]) -> list[list[int]]:
    """Per rank and step: the sizes (elements) of the all-reduces issued during that step."""
    return [[[e[2] for e in s["events"] if e[0] == "issue"] for s in r["steps"]] for r in ranks]


def in_flight_while_computing(events: list) -> int:
    """How many gradients became ready while some all-reduce was issued and not yet waited for."""
    outstanding, count = set(), 0
    for event in events:
        if event[0] == "issue":
            outstanding.add(event[1])
        elif event[0] == "wait":
            outstanding.discard(event[1])
        elif event[0] == "ready" and outstanding:
            count += 1
    return count


# ---- the checks ----------------------------------------------------------------------------

def check_one_bucket(student, reference):
    return gradient_problem(student, reference, "one_bucket")


def check_per_param(student, reference):
    return gradient_problem(student, reference, "per_param")


def check_mid(student, reference):
    return gradient_problem(student, reference, "mid")


def check_three_ranks(student, reference):
    key = "three_ranks"
    ranks = ranks_of(student, reference, key)
    start = ranks[0]["after_init"]
    if not all(close(r["after_init"], start, atol=0.0) for r in ranks[1:]):
        return (f"When {what(reference, key)}, the ranks still hold different weights after BucketedDDP(...): "
                "broadcast every parameter from rank 0 in __init__, as DDP does.")
    return gradient_problem(student, reference, key)


def check_special(student, reference):
    return gradient_problem(student, reference, "special")


def check_buckets(student, reference):
    total = sum(len(g) for g in ranks_of(reference, reference, "one_bucket")[0]["steps"][0]["grads"])
    n_params = len(ranks_of(reference, reference, "per_param")[0]["names"])
    for key, allowed, rule in (
            ("one_bucket", lambda sizes: sizes == [total],
             "one bucket means one dist.all_reduce of one flat tensor holding every gradient"),
            ("per_param", lambda sizes: len(sizes) == n_params and sum(sizes) == total,
             "a bucket smaller than any parameter means one all-reduce per parameter"),
            ("mid", lambda sizes: 1 < len(sizes) < n_params and sum(sizes) == total,
             "each bucket is all-reduced once as one flat tensor, every gradient in exactly one bucket")):
        for rank_calls in calls_per_step(ranks_of(student, reference, key)):
            for step, sizes in enumerate(rank_calls):
                if not sizes:
                    return (f"When {what(reference, key)}, the grader saw no dist.all_reduce in step {step + 1}: "
                            "call dist.all_reduce(flat_bucket, async_op=True) itself (it counts those calls).")
                if not allowed(sizes):
                    return (f"When {what(reference, key)}, step {step + 1} issued {len(sizes)} all-reduce(s) of "
                            f"{sum(sizes)} values in all: {rule}.")
    return None


def check_overlap(student, reference):
    for key in ("per_param", "mid"):
        for rank, r in enumerate(ranks_of(student, reference, key)):
            for step, s in enumerate(r["steps"]):
                where = f"When {what(reference, key)}, in step {step + 1} on rank {rank}"
                events = s["events"]
                issued = [i for i, e in enumerate(events) if e[0] == "issue"]
                backward_done = next((i for i, e in enumerate(events) if e[0] == "backward done"), len(events))
                if issued and issued[0] > backward_done:
                    return (f"{where} every all-reduce started after backward() had finished: launch each bucket's "
                            "all-reduce from a gradient hook as soon as its last gradient is ready.")
                if in_flight_while_computing(events) < 2:
                    return (f"{where} no all-reduce was still running while backward computed further gradients: "
                            "use async_op=True and wait for the handles only in finish_gradient_synchronization.")
    return None


EXERCISE = Exercise(
    name="BucketedDDP",
    notebook="03_data_parallel.ipynb",
    observe=observe,
    observe_reference=observe_reference,
    evidence=averaged_for_real,
    timeout_s=90,  # five launches; a deadlocking submission spends LAUNCH_TIMEOUT_S in each
    checks=[
        Check("Gradients and trained parameters match DDP with one bucket (2 ranks)", 1, check_one_bucket),
        Check("Gradients and trained parameters match DDP with one bucket per parameter (2 ranks)", 1,
              check_per_param),
        Check("Gradients and trained parameters match DDP with buckets in between (2 ranks)", 2, check_mid),
        Check("Broadcasts rank 0's parameters and matches DDP on 3 ranks", 2, check_three_ranks),
        Check("Handles a frozen bias, an unused layer and tied weights as DDP does", 2, check_special),
        Check("One all-reduce per bucket, of the bucket size asked for", 1, check_buckets,
              evidence=("one_bucket", "per_param", "mid")),
        Check("Overlaps: all-reduces run while backward still computes", 2,
              check_overlap, evidence=("per_param", "mid")),
    ],
)
