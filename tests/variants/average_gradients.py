"""Submissions for `average_gradients`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell (run after the notebook's setup cell, which
imports torch, torch.distributed as dist and nn). A wrong entry names the checks (by a phrase of
their title) that must fail for it.
"""
from variants import EVERY_CHECK

PUBLIC_ONLY = {"deadlocks_rank_one"}  # it costs the launch timeout in every scenario: graded under salt 0 only

CORRECT = {
    "per_parameter_sum_then_divide": '''
def average_gradients(model):
    world_size = dist.get_world_size()
    for param in model.parameters():
        if param.grad is None:
            continue
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        param.grad.div_(world_size)
''',
    "reduce_op_avg": '''
def average_gradients(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
''',
    "one_flat_buffer": '''
import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

def average_gradients(model):
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for g, averaged in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(averaged)
''',
    "torch_cat_and_split": '''
import torch

def average_gradients(model):
    params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
    buffer = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(buffer)
    buffer = buffer / dist.get_world_size()
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad = buffer[offset:offset + n].view_as(p.grad).clone()
        offset += n
''',
    "async_then_wait": '''
def average_gradients(model):
    size = float(dist.get_world_size())
    pending = []
    for p in model.parameters():
        if p.grad is not None:
            pending.append((p, dist.all_reduce(p.grad, async_op=True)))
    for p, work in pending:
        work.wait()
        p.grad /= size
''',
    "divide_first_then_sum": '''
import torch

def average_gradients(model):
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is None:
                continue
            p.grad.mul_(1.0 / dist.get_world_size())
            dist.all_reduce(p.grad)
''',
    "named_parameters_and_group": '''
def average_gradients(model):
    group = dist.group.WORLD
    n = dist.get_world_size(group)
    for name, p in model.named_parameters():
        if p.grad is None:
            print(f"skipping {name}: no gradient")
            continue
        dist.all_reduce(p.grad.data, group=group)
        p.grad.data = p.grad.data / n
''',
}

_LOOP = '''
import torch

def average_gradients(model):
    world_size = dist.get_world_size()
    for p in model.parameters():
{body}
'''


def _loop(body: str) -> str:
    return _LOOP.format(body="\n".join("        " + line for line in body.strip().splitlines()))


WRONG = {
    # averages, then takes the optimizer's step itself: the training loop's own step then moves the weights twice
    "also_steps_the_parameters": (_loop('''
if p.grad is not None:
    dist.all_reduce(p.grad)
    p.grad /= world_size
    p.data.add_(p.grad, alpha=-0.01)
'''), ["never the parameters"]),
    "sums_without_dividing": (_loop('''
if p.grad is not None:
    dist.all_reduce(p.grad)
'''), ["the average", "real world size", "matches DDP"]),
    "divides_twice": (_loop('''
if p.grad is not None:
    p.grad /= world_size
    dist.all_reduce(p.grad)
    p.grad /= world_size
'''), ["the average", "matches DDP"]),
    "divides_by_number_of_parameters": ('''
def average_gradients(model):
    params = [p for p in model.parameters() if p.grad is not None]
    for p in params:
        dist.all_reduce(p.grad)
        p.grad /= len(params)
''', ["the average", "matches DDP"]),
    "hard_coded_two": (_loop('''
if p.grad is not None:
    dist.all_reduce(p.grad)
    p.grad /= 2
'''), ["real world size"]),
    "crashes_on_missing_grad": (_loop('''
dist.all_reduce(p.grad)
p.grad /= world_size
'''), ["without a gradient"]),
    "skips_by_requires_grad_only": (_loop('''
if p.requires_grad:
    dist.all_reduce(p.grad)
    p.grad /= world_size
'''), ["without a gradient"]),
    "zero_fills_missing_grads": (_loop('''
if p.grad is None:
    p.grad = torch.zeros_like(p)
dist.all_reduce(p.grad)
p.grad /= world_size
'''), ["without a gradient"]),
    "stops_at_first_missing_grad": (_loop('''
if p.grad is None:
    break
dist.all_reduce(p.grad)
p.grad /= world_size
'''), ["without a gradient"]),
    "averages_parameters": (_loop('''
dist.all_reduce(p.data)
p.data /= world_size
'''), EVERY_CHECK),  # it leaves every gradient as it was
    "reduces_to_rank_zero": (_loop('''
if p.grad is not None:
    dist.reduce(p.grad, dst=0)
    p.grad /= world_size
'''), ["same gradients", "the average", "matches DDP"]),
    "broadcasts_rank_zero": (_loop('''
if p.grad is not None:
    dist.broadcast(p.grad, src=0)
'''), ["the average", "matches DDP"]),
    "averages_a_copy": (_loop('''
if p.grad is not None:
    g = p.grad.clone()
    dist.all_reduce(g)
    g /= world_size
'''), EVERY_CHECK),  # it leaves every gradient as it was
    "deadlocks_rank_one": ('''
import torch

def average_gradients(model):
    if dist.get_rank() == 1:
        dist.recv(torch.zeros(1), src=0)  # waits for a message rank 0 never sends
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
''', ["same gradients", "the average", "real world size", "without a gradient", "matches DDP"]),
    "does_nothing": ('''
def average_gradients(model):
    pass
''', EVERY_CHECK),
    "not_implemented": ('''
def average_gradients(model):
    # YOUR CODE HERE
    raise NotImplementedError()
''', ["same gradients", "the average", "matches DDP"]),
}
