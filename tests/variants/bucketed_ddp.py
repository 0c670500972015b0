"""Submissions for `BucketedDDP`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell (run after the notebook's setup cell, which imports
torch, torch.distributed as dist and nn). Most wrong entries are one mutation of `_BASE`, a correct solution
written differently from the notebook's. A wrong entry names the checks (by a phrase of their title) that must
fail for it.
"""
from variants import EVERY_CHECK

# Graded under salt 0 only (tests/exercises/test_variants.py): five rank launches per observation, and what these get wrong
# does not depend on the seeds. The correct styles and the seed-sensitive mistakes run under the held-out salts too.
HELD_OUT_TOO = {"sums_without_dividing", "does_not_broadcast", "launches_bucket_at_its_first_gradient", "does_nothing"}

_BASE = '''
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, src=0)
        limit = int(bucket_size_mb * 2**20)
        params = [p for p in module.parameters() if p.requires_grad][::-1]
        self.buckets = [[]]
        for p in params:
            if self.buckets[-1] and sum(q.numel() * 4 for q in self.buckets[-1]) + p.numel() * 4 > limit:
                self.buckets.append([])
            self.buckets[-1].append(p)
        self.where = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.count = [0] * len(self.buckets)
        self.handles = []
        for p in params:
            p.register_post_accumulate_grad_hook(self.hook)

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def hook(self, p):
        i = self.where[id(p)]
        self.count[i] += 1
        if self.count[i] == len(self.buckets[i]):
            self.send(i)

    def send(self, i):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[i]]
        flat = _flatten_dense_tensors(grads)
        self.handles.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def finish_gradient_synchronization(self):
        sent = {i for i, _, _ in self.handles}
        for i in range(len(self.buckets)):
            if i not in sent:
                self.send(i)
        for i, flat, handle in self.handles:
            handle.wait()
            flat /= dist.get_world_size()
            for p, averaged in zip(self.buckets[i], _unflatten_dense_tensors(flat, self.buckets[i])):
                if p.grad is not None:
                    p.grad.copy_(averaged)
        self.count = [0 for _ in self.buckets]  # the next backward starts counting afresh
        self.handles = []
'''


def _mutate(*replacements: tuple[str, str]) -> str:
    """_BASE with each (old, new) replaced once: a one-line mistake in an otherwise correct solution."""
    source = _BASE
    for old, new in replacements:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


CORRECT = {
    "flatten_helpers_divide_after": _BASE,
    "ddp_rule_tensor_hooks_avg_and_prints": '''
import torch
from torch.distributed import all_reduce  # bound before the grader's ranks fork: still counted


class BucketedDDP(torch.nn.Module):
    """Buckets close once they reach the size (DDP's rule); hooks on the gradient itself (register_hook)."""

    def __init__(self, module: torch.nn.Module, bucket_size_mb: float):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for name, tensor in module.state_dict(keep_vars=True).items():
                torch.distributed.broadcast(tensor, 0)
        cap = bucket_size_mb * 1024 * 1024
        self.plan, current, filled = [], [], 0
        seen = set()
        for name, p in reversed(list(module.named_parameters())):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            current.append(p)
            filled += p.numel() * p.element_size()
            if filled >= cap:
                self.plan.append(current)
                current, filled = [], 0
        if current:
            self.plan.append(current)
        print(f"{len(self.plan)} buckets")
        self.arrived = [dict() for _ in self.plan]
        self.work = [None] * len(self.plan)
        for b, bucket in enumerate(self.plan):
            for p in bucket:
                p.register_hook(lambda grad, b=b, p=p: self._arrive(b, p, grad))

    def forward(self, x):
        return self.module(x)

    def _arrive(self, b, p, grad):
        self.arrived[b][id(p)] = grad.detach().clone()
        if len(self.arrived[b]) == len(self.plan[b]):
            self._start(b)
        return grad

    def _start(self, b):
        pieces = [self.arrived[b].get(id(p), torch.zeros_like(p)).flatten() for p in self.plan[b]]
        buffer = torch.cat(pieces)
        self.work[b] = (buffer, all_reduce(buffer, op=dist.ReduceOp.AVG, async_op=True))

    def finish_gradient_synchronization(self):
        for b in range(len(self.plan)):
            if self.work[b] is None:
                self._start(b)
            buffer, work = self.work[b]
            work.wait()
            for p, piece in zip(self.plan[b], buffer.split([p.numel() for p in self.plan[b]])):
                if p.grad is not None:
                    p.grad = piece.view_as(p).clone()
        self.arrived = [dict() for _ in self.plan]
        self.work = [None] * len(self.plan)
''',
    "futures_wait_all_forward_order": '''
import torch


class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        self.n = dist.get_world_size()
        for p in self.module.parameters():
            with torch.no_grad():
                dist.broadcast(p, 0)
        # buckets in registration order (valid too: only overlap suffers a little)
        budget = bucket_size_mb * 1024 ** 2
        self.buckets, used = [], budget + 1
        for p in self.module.parameters():
            if not p.requires_grad:
                continue
            size = p.numel() * p.element_size()
            if used + size > budget:
                self.buckets.append([])
                used = 0
            self.buckets[-1].append(p)
            used += size
        self.pending = {}
        self.futures = []
        for index, bucket in enumerate(self.buckets):
            for p in bucket:
                p.register_post_accumulate_grad_hook(self._make_hook(index))

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        return out

    def _make_hook(self, index):
        def hook(param):
            self.pending.setdefault(index, set()).add(param)
            if len(self.pending[index]) == len(self.buckets[index]):
                self._reduce(index)
        return hook

    def _reduce(self, index):
        bucket = self.buckets[index]
        flat = torch.cat([torch.zeros(p.numel()) if p.grad is None else p.grad.view(-1) / self.n for p in bucket])
        future = dist.all_reduce(flat, async_op=True).get_future()
        self.futures.append(future.then(lambda fut, bucket=bucket, flat=flat: self._unpack(bucket, flat)))
        self.pending[index] = None

    @staticmethod
    def _unpack(bucket, flat):
        start = 0
        for p in bucket:
            if p.grad is not None:
                p.grad.copy_(flat[start:start + p.numel()].view_as(p))
            start += p.numel()

    def finish_gradient_synchronization(self):
        for index in range(len(self.buckets)):
            if self.pending.get(index, ()) is not None:
                self._reduce(index)
        torch.futures.wait_all(self.futures)
        self.futures, self.pending = [], {}
''',
}

WRONG = {
    "waits_at_once_in_the_hook": (_mutate(
        ("self.handles.append((i, flat, dist.all_reduce(flat, async_op=True)))",
         "handle = dist.all_reduce(flat, async_op=True)\n        handle.wait()\n"
         "        self.handles.append((i, flat, handle))")), ["Overlaps"]),
    "synchronous_all_reduce_per_bucket": (_mutate(
        ("self.handles.append((i, flat, dist.all_reduce(flat, async_op=True)))",
         "dist.all_reduce(flat)\n        self.handles.append((i, flat, torch.futures.Future()))"),
        ("            handle.wait()\n", "")), ["Overlaps"]),
    "all_reduce_only_after_backward": (_mutate(
        ("        if self.count[i] == len(self.buckets[i]):\n            self.send(i)\n", "")), ["Overlaps"]),
    "sums_without_dividing": (_mutate(
        ("            flat /= dist.get_world_size()\n", "")),
        ["one bucket (2", "one bucket per parameter", "in between", "3 ranks", "frozen bias"]),
    "rank_dependent_bucket_order": (_mutate(
        ("[::-1]\n", "[::-1] if dist.get_rank() == 0 else [p for p in module.parameters() if p.requires_grad]\n")),
        ["one bucket (2", "in between", "frozen bias"]),
    "launches_bucket_at_its_first_gradient": (_mutate(
        ("if self.count[i] == len(self.buckets[i]):", "if self.count[i] == 1:")),
        ["one bucket (2", "in between", "frozen bias"]),
    "one_all_reduce_per_parameter": (_mutate(
        ("if self.buckets[-1] and sum(q.numel() * 4 for q in self.buckets[-1]) + p.numel() * 4 > limit:",
         "if self.buckets[-1]:  # one parameter per bucket, whatever the size")), ["One all-reduce per bucket"]),
    "never_resets_between_steps": (_mutate(  # later steps' hooks never complete a bucket: sent after backward
        ("        self.count = [0 for _ in self.buckets]  # the next backward starts counting afresh\n", "")),
        ["Overlaps"]),
    "hooks_on_frozen_parameters": (_mutate(
        ("        for p in params:\n            p.register_post_accumulate_grad_hook",
         "        for p in module.parameters():\n            p.register_post_accumulate_grad_hook")),
        ["frozen bias"]),
    "never_sends_bucket_with_unused_parameter": (_mutate(
        ("        sent = {i for i, _, _ in self.handles}\n        for i in range(len(self.buckets)):\n"
         "            if i not in sent:\n                self.send(i)\n", "")), ["frozen bias"]),
    "waits_forever_for_unused_parameter": (_mutate(  # the deadlock: stopped after the launch timeout, no process left
        ("        sent = {i for i, _, _ in self.handles}\n        for i in range(len(self.buckets)):\n"
         "            if i not in sent:\n                self.send(i)\n",
         "        while len(self.handles) < len(self.buckets):  # an unused layer's hook never fires\n"
         "            pass\n")), ["frozen bias"]),
    "does_not_broadcast": (_mutate(
        ("        for p in module.parameters():\n            dist.broadcast(p.data, src=0)\n", "")),
        ["3 ranks"]),
    "wraps_torch_ddp": ('''
class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.ddp = nn.parallel.DistributedDataParallel(module, bucket_cap_mb=bucket_size_mb,
                                                       find_unused_parameters=True)

    def forward(self, *inputs, **kwargs):
        return self.ddp(*inputs, **kwargs)

    def finish_gradient_synchronization(self):
        pass
''', EVERY_CHECK),
    "does_nothing": ('''
class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self):
        pass
''', EVERY_CHECK),
    "zeroes_the_gradients": ('''
class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.zero_()
''', EVERY_CHECK),
    "not_implemented": ('''
class BucketedDDP(nn.Module):
    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module = module
        # YOUR CODE HERE
        raise NotImplementedError()

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def finish_gradient_synchronization(self):
        # YOUR CODE HERE
        raise NotImplementedError()
''', EVERY_CHECK),
}

PUBLIC_ONLY = set(WRONG) - HELD_OUT_TOO
