"""Submissions for `MiniFSDP`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell (every one imports what it uses, as the
reference does). The wrong variants are the reference's style with one mistake each (``_mistake``), so
that each loses marks for that mistake alone. A wrong entry names the checks (by a phrase of their title) that
must fail for it.
"""
from variants import EVERY_CHECK

PUBLIC_ONLY = {"deadlocks_rank_one"}  # graded at salt 0 only: it costs the launch timeout in every scenario

_FLAT_AUTOGRAD = '''
import torch
import torch.distributed as dist
from torch import nn


class _GatherFlat(torch.autograd.Function):
    """All-gather one layer's flat shards; in backward keep the full gradient for the reduce-scatter later."""

    @staticmethod
    def forward(ctx, shard, owner, index):
        full = torch.empty(shard.numel() * dist.get_world_size(), dtype=shard.dtype)
        dist.all_gather_into_tensor(full, shard.contiguous())
        ctx.owner, ctx.index = owner, index
        return full

    @staticmethod
    def backward(ctx, grad_full):
        ctx.owner.full_grads[ctx.index] = grad_full  # reduce-scattered by finish_gradient_synchronization
        return None, None, None


class MiniFSDP(nn.Module):
    """A minimal FSDP over the children of an ``nn.Sequential``: every rank keeps one shard of each layer."""

    def __init__(self, module: nn.Sequential, param_dtype=None):
        super().__init__()
        self.module, self.param_dtype = module, param_dtype
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.shards = nn.ParameterDict()   # child name -> this rank's fp32 shard of the flat, padded layer
        self.layout = {}                   # child name -> [(parameter name, shape, numel)]
        self.full_grads = {}               # child name -> full flat gradient, until it is reduce-scattered
        for child_name, child in module.named_children():
            params = list(child.named_parameters(recurse=False))
            if not params:
                continue
            self.layout[child_name] = [(name, p.shape, p.numel()) for name, p in params]
            flat = torch.cat([p.detach().float().flatten() for _, p in params])
            pad = -flat.numel() % self.world_size
            flat = torch.cat([flat, flat.new_zeros(pad)])
            self.shards[child_name] = nn.Parameter(flat.chunk(self.world_size)[self.rank].clone())
            for name, _ in params:
                del child._parameters[name]  # the full tensor is gone: only the shard stays
                setattr(child, name, None)

    def forward(self, *inputs):
        if self.param_dtype is not None:
            inputs = tuple(x.to(self.param_dtype) if x.is_floating_point() else x for x in inputs)
        for child_name, child in self.module.named_children():
            if child_name in self.layout:
                shard = self.shards[child_name]
                if self.param_dtype is not None:
                    shard = shard.to(self.param_dtype)
                flat, offset = _GatherFlat.apply(shard, self, child_name), 0
                for name, shape, numel in self.layout[child_name]:
                    setattr(child, name, flat[offset:offset + numel].view(shape))
                    offset += numel
            inputs = (child(*inputs),)
            for name, _, _ in self.layout.get(child_name, []):
                setattr(child, name, None)  # freed: only what autograd saved for backward keeps it
        return inputs[0]

    def finish_gradient_synchronization(self):
        for child_name, shard in self.shards.items():
            full = self.full_grads.pop(child_name, None)
            if full is None:
                continue
            grad = torch.empty_like(shard)
            dist.reduce_scatter_single(grad, full.float().contiguous())
            grad /= self.world_size
            shard.grad = grad if shard.grad is None else shard.grad + grad

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        full_params = {}
        for child_name, shard in self.shards.items():
            flat = torch.empty(shard.numel() * self.world_size)
            dist.all_gather_into_tensor(flat, shard.detach().float())
            offset = 0
            for name, shape, numel in self.layout[child_name]:
                full_params[f"{child_name}.{name}"] = flat[offset:offset + numel].view(shape).clone()
                offset += numel
        return full_params
'''

CORRECT = {
    # one flat, padded buffer per layer; an autograd Function keeps the full gradient for a reduce-scatter later
    "flat_autograd_function": _FLAT_AUTOGRAD,
    # no autograd Function: a leaf tensor per gather, a gradient hook, list collectives with ReduceOp.AVG
    "gradient_hooks_and_lists": '''
import torch
import torch.distributed as dist
from torch import nn


class MiniFSDP(nn.Module):
    def __init__(self, module, param_dtype=None):
        super().__init__()
        self.module = module
        self.param_dtype = param_dtype
        self.ws = dist.get_world_size()
        self.flat_shards = nn.ParameterList()
        self.specs = []
        self.pending = []
        for layer in module:
            params = dict(layer.named_parameters(recurse=False))
            if not params:
                self.specs.append(None)
                continue
            total = sum(p.numel() for p in params.values())
            per_rank = (total + self.ws - 1) // self.ws
            flat = torch.zeros(per_rank * self.ws)
            flat[:total] = torch.cat([p.detach().reshape(-1) for p in params.values()])
            self.flat_shards.append(nn.Parameter(flat[dist.get_rank() * per_rank:(dist.get_rank() + 1) * per_rank].clone()))
            self.specs.append((len(self.flat_shards) - 1, [(n, p.shape) for n, p in params.items()]))
            for n in params:
                delattr(layer, n)

    def forward(self, *inputs):
        out = inputs[0] if self.param_dtype is None else inputs[0].to(self.param_dtype)
        for layer, spec in zip(self.module, self.specs):
            if spec is not None:
                index, shapes = spec
                shard = self.flat_shards[index].detach()
                if self.param_dtype is not None:
                    shard = shard.to(self.param_dtype)
                pieces = [torch.empty_like(shard) for _ in range(self.ws)]
                dist.all_gather(pieces, shard)
                full = torch.cat(pieces).requires_grad_()
                full.register_hook(lambda g, index=index: self.pending.append((index, g)))
                start = 0
                for name, shape in shapes:
                    setattr(layer, name, full[start:start + shape.numel()].view(shape))
                    start += shape.numel()
                out = layer(out)
                for name, _ in shapes:
                    setattr(layer, name, None)
                del full, pieces
            else:
                out = layer(out)
        return out

    def finish_gradient_synchronization(self):
        for index, full_grad in self.pending:
            shard = self.flat_shards[index]
            piece = torch.empty_like(shard)
            dist.reduce_scatter(piece, list(full_grad.float().chunk(self.ws)), op=dist.ReduceOp.AVG)
            shard.grad = piece if shard.grad is None else shard.grad + piece
        self.pending = []

    def gather_full_params(self):
        result = {}
        for (name, layer), spec in zip(self.module.named_children(), self.specs):
            if spec is None:
                continue
            index, shapes = spec
            pieces = [torch.empty_like(self.flat_shards[index]) for _ in range(self.ws)]
            dist.all_gather(pieces, self.flat_shards[index].detach())
            full = torch.cat(pieces)
            start = 0
            for pname, shape in shapes:
                result[f"{name}.{pname}"] = full[start:start + shape.numel()].reshape(shape).clone()
                start += shape.numel()
        return result
''',
    # every parameter sharded on its own, torch.func.functional_call, async reduce-scatter during backward
    "per_parameter_async": '''
import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call


class AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, key, works):
        world = dist.get_world_size()
        full = shard.new_empty(shard.numel() * world)
        dist.all_gather_into_tensor(full, shard)
        ctx.works, ctx.key, ctx.numel = works, key, shard.numel()
        return full

    @staticmethod
    def backward(ctx, grad_full):
        grad = torch.empty(ctx.numel, dtype=torch.float32)
        work = dist.reduce_scatter_single(grad, grad_full.float().contiguous(), async_op=True)
        ctx.works.append((ctx.key, work, grad))  # waited for in finish_gradient_synchronization
        return None, None, None


class MiniFSDP(nn.Module):
    def __init__(self, module, param_dtype=None):
        super().__init__()
        self.layers = module
        self.param_dtype = param_dtype
        world, rank = dist.get_world_size(), dist.get_rank()
        self.shards = nn.ParameterDict()
        self.meta = {}
        self.works = []
        for lname, layer in module.named_children():
            for pname, p in list(layer.named_parameters(recurse=False)):
                flat = p.detach().reshape(-1)
                padded = nn.functional.pad(flat, (0, (-flat.numel()) % world))
                key = f"{lname}_{pname}"
                self.shards[key] = nn.Parameter(padded.view(world, -1)[rank].clone())
                self.meta[key] = (lname, pname, p.shape)
                layer._parameters.pop(pname)
                setattr(layer, pname, None)

    def forward(self, *inputs):
        x = inputs[0]
        if self.param_dtype is not None:
            x = x.to(self.param_dtype)
        for lname, layer in self.layers.named_children():
            params = {}
            for key, (owner, pname, shape) in self.meta.items():
                if owner == lname:
                    shard = self.shards[key]
                    if self.param_dtype is not None:
                        shard = shard.to(self.param_dtype)
                    params[pname] = AllGather.apply(shard, key, self.works)[:shape.numel()].view(shape)
            x = functional_call(layer, params, (x,)) if params else layer(x)
        return x

    def finish_gradient_synchronization(self):
        for key, work, grad in self.works:
            work.wait()
            grad.div_(dist.get_world_size())
            shard = self.shards[key]
            shard.grad = grad if shard.grad is None else shard.grad + grad
        self.works.clear()

    def gather_full_params(self):
        out = {}
        for key, (lname, pname, shape) in self.meta.items():
            full = torch.empty(self.shards[key].numel() * dist.get_world_size())
            dist.all_gather_into_tensor(full, self.shards[key].detach())
            out[f"{lname}.{pname}"] = full[:shape.numel()].view(shape).clone()
        return out
''',
}


def _mistake(*replacements: tuple[str, str]) -> str:
    source = _FLAT_AUTOGRAD
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    return source


WRONG = {
    "no_padding": (_mistake(("pad = -flat.numel() % self.world_size", "pad = 0"),
                            ("flat.chunk(self.world_size)[self.rank]",
                             "flat.tensor_split(self.world_size)[self.rank]")),
                   ["3 ranks"]),
    "shards_columns_gathers_rows": (_mistake(
        ("""            flat = torch.cat([p.detach().float().flatten() for _, p in params])
            pad = -flat.numel() % self.world_size
            flat = torch.cat([flat, flat.new_zeros(pad)])
            self.shards[child_name] = nn.Parameter(flat.chunk(self.world_size)[self.rank].clone())""",
         """            # each weight split by columns (dim 1), the bias by rows, then flattened
            pieces = [p.detach().float().chunk(self.world_size, dim=p.dim() - 1)[self.rank].flatten()
                      for _, p in params]
            self.shards[child_name] = nn.Parameter(torch.cat(pieces))""")), ["float32, 2 ranks", "3 ranks"]),
    "forgets_to_divide": (_mistake(("            grad /= self.world_size\n", "")),
                          ["float32, 2 ranks", "3 ranks", "gather_full_params", "bfloat16, losses"]),
    "never_frees_gathered": (_mistake(("                setattr(child, name, None)  # freed", "                pass  # ")),
                             ["Frees each layer"]),
    "all_reduce_keeps_full_grads": (_mistake(
        ("""            grad = torch.empty_like(shard)
            dist.reduce_scatter_single(grad, full.float().contiguous())
            grad /= self.world_size""",
         """            full = full.float()
            dist.all_reduce(full)
            full /= self.world_size
            grad = full.chunk(self.world_size)[self.rank]""")), ["gradient shard"]),
    "bf16_master_weights": (_mistake(
        ("self.shards[child_name] = nn.Parameter(flat.chunk(self.world_size)[self.rank].clone())",
         "self.shards[child_name] = nn.Parameter(flat.chunk(self.world_size)[self.rank].clone().to(\n"
         "                param_dtype or torch.float32))"),
        ("grad = torch.empty_like(shard)", "grad = torch.empty_like(shard, dtype=torch.float32)"),
        ("shard.grad = grad if", "grad = grad.to(shard.dtype)\n            shard.grad = grad if")),
        ["master weights stay float32"]),
    "calls_torch_fully_shard": ('''
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class MiniFSDP(nn.Module):
    def __init__(self, module, param_dtype=None):
        super().__init__()
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        for layer in module:
            if list(layer.parameters()):
                fully_shard(layer, mp_policy=policy)
        self.module = fully_shard(module, mp_policy=policy)

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        pass

    def gather_full_params(self):
        return {name: p.full_tensor() for name, p in self.module.named_parameters()}
''', EVERY_CHECK),
    "unsharded_wrapper": ('''
import torch
from torch import nn


class MiniFSDP(nn.Module):
    def __init__(self, module, param_dtype=None):
        super().__init__()
        self.module = module

    def forward(self, *inputs):
        return self.module(*inputs)

    def finish_gradient_synchronization(self):
        pass

    def gather_full_params(self):
        return {name: p.detach().clone() for name, p in self.module.named_parameters()}
''', ["float32, 2 ranks", "3 ranks", "only its shard", "Frees each layer", "gradient shard"]),
    "deadlocks_rank_one": (_mistake(("    def finish_gradient_synchronization(self):\n",
                                     "    def finish_gradient_synchronization(self):\n"
                                     "        if self.rank == 1:\n"
                                     "            dist.recv(torch.zeros(1), src=0)  # rank 0 never sends\n")),
                           EVERY_CHECK),
    "constant_output": ('''
import torch
from torch import nn


class MiniFSDP(nn.Module):
    def __init__(self, module, param_dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, *inputs):
        return torch.zeros(inputs[0].shape[0], 3) * self.weight

    def finish_gradient_synchronization(self):
        pass

    def gather_full_params(self):
        return {}
''', EVERY_CHECK),
    "not_implemented": ('''
import torch
from torch import nn


class MiniFSDP(nn.Module):
    def __init__(self, module, param_dtype=None):
        super().__init__()
        # YOUR CODE HERE
        raise NotImplementedError()
''', EVERY_CHECK),
}
