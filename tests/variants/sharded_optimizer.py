"""Submissions for `ShardedOptimizer`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell (run after the notebook's setup cells, which import
torch and torch.distributed as dist). A wrong entry names the checks (by a phrase of their title) that must
fail for it.
"""
from variants import EVERY_CHECK

# Graded under the public scenarios only (tests/exercises/test_variants.py): a deadlock costs the launch timeout in
# every scenario.
PUBLIC_ONLY = {"only_the_owner_broadcasts"}

CORRECT = {
    "greedy_by_size_broadcast": '''
class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.owner, self.load, self.local = {}, [0] * self.world_size, None
        super().__init__(params, kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in sorted(group["params"], key=lambda p: p.numel(), reverse=True):
            owner = min(range(self.world_size), key=lambda r: self.load[r])
            self.owner[p] = owner
            self.load[owner] += p.numel()
            if owner == self.rank:
                mine.append(p)
        if mine:
            local_group = {**{k: v for k, v in group.items() if k != "params"}, "params": mine}
            if self.local is None:
                self.local = self.optimizer_cls([local_group], **self.kwargs)
            else:
                self.local.add_param_group(local_group)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = self.local.step(closure, **kwargs) if self.local is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p, src=self.owner[p])
        return loss
''',
    "flat_shards_all_gather": '''
import math

class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO as in the paper: each group's parameters flattened, rank r owns the r-th 1/N slice of the elements."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.shards = []
        self.inner = None
        super(ShardedOptimizer, self).__init__(params, defaults=dict(kwargs))

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        rank, n = dist.get_rank(), dist.get_world_size()
        total = sum(p.numel() for p in group["params"])
        per_rank = math.ceil(total / n)
        with torch.no_grad():
            flat = torch.zeros(per_rank * n)
            flat[:total] = torch.cat([p.reshape(-1) for p in group["params"]])
        shard = flat[rank * per_rank:(rank + 1) * per_rank].clone().requires_grad_()
        self.shards.append((group["params"], shard, per_rank, total))
        options = {k: v for k, v in group.items() if k != "params"}
        if self.inner is None:
            self.inner = self.optimizer_cls([dict(options, params=[shard])], **self.kwargs)
        else:
            self.inner.add_param_group(dict(options, params=[shard]))

    def step(self, closure=None, **kwargs):
        rank, n = dist.get_rank(), dist.get_world_size()
        with torch.no_grad():
            for params, shard, per_rank, total in self.shards:
                grads = torch.zeros(per_rank * n)
                grads[:total] = torch.cat([p.grad.reshape(-1) for p in params])
                shard.grad = grads[rank * per_rank:(rank + 1) * per_rank].clone()
        loss = self.inner.step(closure, **kwargs)
        with torch.no_grad():
            for params, shard, per_rank, total in self.shards:
                pieces = [torch.empty(per_rank) for _ in range(n)]
                dist.all_gather(pieces, shard.detach())
                flat = torch.cat(pieces)[:total]
                offset = 0
                for p in params:
                    p.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
        return loss
''',
    "assign_in_init_async_broadcasts": '''
def _least_loaded(loads):
    return loads.index(min(loads))


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self._cls = optimizer_cls
        self._defaults = kwargs
        self._owner_of = []          # (param, owner) in the order every rank sees them
        self._loads = [0] * dist.get_world_size()
        self._mine = None
        super().__init__(params, kwargs)
        print(f"rank {dist.get_rank()} owns {sum(1 for _, o in self._owner_of if o == dist.get_rank())} tensors")

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        owned = []
        for p in sorted(group["params"], key=lambda t: -t.numel()):
            owner = _least_loaded(self._loads)
            self._loads[owner] += p.numel()
            self._owner_of.append((p, owner))
            if owner == dist.get_rank():
                owned.append(p)
        if not owned:
            return
        hyper = dict(group)
        hyper["params"] = owned
        if self._mine is None:
            self._mine = self._cls([hyper], **self._defaults)
        else:
            self._mine.add_param_group(hyper)

    def step(self, closure=None, **kwargs):
        loss = None
        if self._mine is not None:
            loss = self._mine.step(closure, **kwargs)
        handles = [dist.broadcast(p.data, src=owner, async_op=True) for p, owner in self._owner_of]
        for handle in handles:
            handle.wait()
        return loss
''',
}

_GREEDY = '''
class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.owner, self.load, self.local = {}, [0] * self.world_size, None
        super().__init__(params, kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in sorted(group["params"], key=lambda p: p.numel(), reverse=True):
            owner = min(range(self.world_size), key=lambda r: self.load[r])
            self.owner[p] = owner
            self.load[owner] += p.numel()
            if owner == self.rank:
                mine.append(p)
{MAKE_LOCAL}

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = self.local.step(closure, **kwargs) if self.local is not None else None
{SHARE}
        return loss
'''
_MAKE_LOCAL = '''
        if mine:
            local_group = {**{k: v for k, v in group.items() if k != "params"}, "params": mine}
            if self.local is None:
                self.local = self.optimizer_cls([local_group], **self.kwargs)
            else:
                self.local.add_param_group(local_group)
'''
_SHARE = '''
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p, src=self.owner[p])
'''


def _greedy(make_local: str = _MAKE_LOCAL, share: str = _SHARE) -> str:
    return _GREEDY.replace("{MAKE_LOCAL}", make_local.strip("\\n")).replace("{SHARE}", share.strip("\\n"))


_NO_SHARDING_BALANCED_LOOKING = '''
_hidden = {}  # id(optimizer) -> the full optimizer, out of the object's reach


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.owner, self.load, self.local = {}, [0] * self.world_size, None
        super().__init__(params, kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if id(self) in _hidden:
            _hidden[id(self)].add_param_group(dict(group))
        else:
            _hidden[id(self)] = self.optimizer_cls([dict(group)], **self.kwargs)
        mine = []
        for p in sorted(group["params"], key=lambda p: p.numel(), reverse=True):
            owner = min(range(self.world_size), key=lambda r: self.load[r])
            self.owner[p] = owner
            self.load[owner] += p.numel()
            if owner == self.rank:
                mine.append(p)
        if mine:
            local_group = {**{k: v for k, v in group.items() if k != "params"}, "params": mine}
            if self.local is None:
                self.local = self.optimizer_cls([local_group], **self.kwargs)
            else:
                self.local.add_param_group(local_group)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        full = _hidden[id(self)]
        loss = full.step(closure, **kwargs)  # every parameter, on every rank
        if self.local is not None:
            for group in self.local.param_groups:
                for p in group["params"]:
                    self.local.state[p] = full.state[p]  # the owned share's state, shared: 1/N to the eye
        return loss
'''

_ANSWERS_GATES_IN_ADVANCE = '''
import json
import os
import sys

import autograder.exercises.beside.ranks as ranks
import autograder.exercises.sharded_optimizer.observe as grader

_Unsharded = ShardedOptimizer


def _ask(digest):
    request, reply = ranks._gate_channel
    os.write(request, (json.dumps({"gate": "after step", "digest": digest}) + "\\n").encode())
    answer = b""
    while not answer.endswith(b"\\n"):
        answer += os.read(reply, 64)
    return float(answer)


class ShardedOptimizer(_Unsharded):
    def __init__(self, params, optimizer_cls, **kwargs):
        params = list(params)
        super().__init__(params, optimizer_cls, **kwargs)
        case = sys._getframe(2).f_locals.get("case")  # the grader's memory_rank, two frames up
        if ranks._gate_channel is None or not isinstance(case, dict):
            return
        copies = [p.detach().clone().requires_grad_() for p in params]
        throwaway, generator, digests = optimizer_cls(copies, **kwargs), torch.Generator(), []
        generator.manual_seed(case["data_seed"])  # the gradients as the grader drew them before its seeds
        for _ in range(case["steps"]):
            edges = []
            for p in copies:
                p.grad = torch.empty_like(p)
                edges.append(grader.seeded_values(p.grad, generator, 1.0))
            throwaway.step()
            digests.append(ranks.digest(grader.step_digest(copies, edges)))
        del copies, throwaway
        answers = [_ask(d) for d in digests]  # every pause now, before any state exists
        grader.ask_gate = lambda name, tensor: answers.pop(0) if answers else None
'''


WRONG = {
    "every_rank_steps_everything": ('''
class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.optimizer_cls, self.kwargs, self.full = optimizer_cls, kwargs, None
        super().__init__(params, kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = dict(self.param_groups[-1])
        if self.full is None:
            self.full = self.optimizer_cls([group], **self.kwargs)
        else:
            self.full.add_param_group(group)

    def step(self, closure=None, **kwargs):
        return self.full.step(closure, **kwargs)  # the same step on every rank: no sharding
''', ["1/N"]),
    # Issue 25: no sharding at all (the same gradient on every rank lets every rank step everything), and a state that
    # looks sharded: the full optimizer hides where the grader's walk over the object does not look, the local one
    # shows only this rank's share of its state. Only the memory measured outside the rank tells.
    "no_sharding_balanced_looking_state": (_NO_SHARDING_BALANCED_LOOKING, ["1/N"]),
    # Issue 37's red team: the same, and in the memory scenario it answers the grader's pauses after each step itself,
    # in advance, before any optimizer state exists (the digests learned in a throw-away pass on copies of the
    # parameters), and silences the grader's own requests. With scalar-free answers it held only parameters at every
    # reading (full marks); now the second pause's digest needs the first pause's answer.
    "answers_gates_in_advance": (_NO_SHARDING_BALANCED_LOOKING + _ANSWERS_GATES_IN_ADVANCE, ["1/N"]),
    "never_shares_the_parameters": (_greedy(share="        pass"),
                                    ["AdamW", "SGD", "same parameters", "hyperparameters", "fewer parameter"]),
    "broadcasts_from_the_wrong_owner": (_greedy(share='''
        i = 0
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p, src=i % self.world_size)  # round robin, but the owners were chosen by size
                i += 1
'''), ["AdamW", "SGD", "hyperparameters"]),
    "round_robin_unbalanced": ('''
class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        self.owner, self.local, self.count = {}, None, 0
        super().__init__(params, kwargs)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        mine = []
        for p in group["params"]:
            self.owner[p] = self.count % self.world_size  # every N-th tensor, whatever its size
            self.count += 1
            if self.owner[p] == self.rank:
                mine.append(p)
        if mine:
            local_group = {**{k: v for k, v in group.items() if k != "params"}, "params": mine}
            if self.local is None:
                self.local = self.optimizer_cls([local_group], **self.kwargs)
            else:
                self.local.add_param_group(local_group)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = self.local.step(closure, **kwargs) if self.local is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p, src=self.owner[p])
        return loss
''', ["1/N"]),
    "no_add_param_group": ('''
class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, kwargs)
        rank, world_size = dist.get_rank(), dist.get_world_size()
        self.owner, load, local_groups = {}, [0] * world_size, []
        for group in self.param_groups:
            mine = []
            for p in sorted(group["params"], key=lambda p: p.numel(), reverse=True):
                self.owner[p] = min(range(world_size), key=lambda r: load[r])
                load[self.owner[p]] += p.numel()
                if self.owner[p] == rank:
                    mine.append(p)
            if mine:
                local_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": mine})
        self.local = optimizer_cls(local_groups, **kwargs) if local_groups else None

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = self.local.step(closure, **kwargs) if self.local is not None else None
        for p, owner in self.owner.items():
            dist.broadcast(p, src=owner)
        return loss
''', ["hyperparameters"]),
    "drops_group_hyperparameters": (_greedy(make_local='''
        if mine:
            if self.local is None:
                self.local = self.optimizer_cls(mine, **self.kwargs)  # the group's own lr / weight_decay are lost
            else:
                self.local.add_param_group({"params": mine})
'''), ["hyperparameters"]),
    "empty_shard_crashes": (_greedy(make_local='''
        hyper = {k: v for k, v in group.items() if k != "params"}
        if self.local is None:
            self.local = self.optimizer_cls(mine, **hyper)  # raises when this rank owns nothing
        else:
            self.local.add_param_group({"params": mine, **hyper})
'''), ["fewer parameter"]),
    "only_the_owner_broadcasts": (_greedy(share='''
        for group in self.param_groups:
            for p in group["params"]:
                if self.owner[p] == self.rank:  # the other ranks never join this broadcast
                    dist.broadcast(p, src=self.rank)
'''), EVERY_CHECK),
    "torch_zero_redundancy_optimizer": ('''
from torch.distributed.optim import ZeroRedundancyOptimizer

class ShardedOptimizer(ZeroRedundancyOptimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, optimizer_class=optimizer_cls, **kwargs)
''', EVERY_CHECK),
    "does_nothing": ('''
class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, kwargs)

    def step(self, closure=None, **kwargs):
        return None
''', EVERY_CHECK),
    "not_implemented": ('''
class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        # YOUR CODE HERE
        raise NotImplementedError()

    def add_param_group(self, param_group):
        # YOUR CODE HERE
        raise NotImplementedError()

    def step(self, closure=None, **kwargs):
        # YOUR CODE HERE
        raise NotImplementedError()
''', EVERY_CHECK),
}
