"""Submissions for `MiniFSDP`: valid styles that must score full, plausible mistakes that must not.

Each entry is the source of the student's exercise cell (every one imports what it uses, as the
reference does). The wrong variants are an older style (``_FLAT_AUTOGRAD``: autograd keeps each gathered layer
until its backward) with one mistake each (``_mistake``), so that each loses marks for that mistake alone. A wrong
entry names the checks (by a phrase of their title) that must fail for it.

What an outside memory measurement should see (the contract in Lesson 5 says: peak memory of a rank over one
step at most about two full layers beyond the shards and their gradients). Measured with the live tensor bytes of
each rank (coursekit.memory.live_tensor_bytes: every storage alive, any thread; gloo's internal copies not seen),
6 x Linear(512, 512), batch 16, 2 gloo ranks, SGD, one step after two warm-up steps, in units of one full layer
(1,050,624 bytes); "resident" = shards + their gradients = 6.03 layers for every sharded style:

    style                                  after the forward   peak of the step   peak - resident
    reference (saved-tensor hooks)                6.25               9.69               3.7
    saved_tensor_hooks_list_collectives           6.25               9.2-9.6            3.2-3.6
    per_parameter_functional_call                 6.25               8.7-9.1            2.7-3.1
    resizes_storage_regathers_in_backward_hook    6.25              10.19               4.2
    recomputes_layer_in_backward                  6.25              11.2-11.3           5.2
    torch FSDP2 (fully_shard per layer)           6.25              10.22               4.2
    keeps_gathered_layers_for_backward           11.25              14.03               8.0
    the old reference (leaf per gather)          12.25              25.5               19.5
    DDP (gradient_as_bucket_view, unsharded)     12.25              13.25               —

So "keeps every gathered layer" shows from 5 layers of 512 x 512 on: after the forward it holds L - 1 extra full
layers (the first layer's weight is not saved: its input needs no gradient), at the peak about 8 against about 4
for FSDP2 and every style that re-gathers. A threshold of about 5 full layers above the resident bytes separates
them at this size; the transient part (a re-gathered layer, its weight gradient, the flat gradient and gloo's
buffers while the reduce-scatter runs) is about 3-4 layers on gloo.
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
        full = shard.new_empty(shard.numel() * dist.get_world_size())
        dist.all_gather_single(full, shard.contiguous())
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
            flat = shard.detach().new_empty(shard.numel() * self.world_size)
            dist.all_gather_single(flat, shard.detach().float())
            offset = 0
            for name, shape, numel in self.layout[child_name]:
                full_params[f"{child_name}.{name}"] = flat[offset:offset + numel].view(shape).clone()
                offset += numel
        return full_params
'''


# Issue 37's red team: keeps every gathered layer (as above), and before its real forward learns each pause's gradient
# digest in a throw-away pass with the gates silenced, then writes all its gate requests itself while it holds only
# shards (each digest scaled by the factors answered so far, as scalar factors once allowed), and lets the real
# backward through the gates with the answers it already has. Scored 12/12 while a rank asked for its pauses; the
# launcher's seeds now make each pause's gradient depend on the answer at the one before.
_ANSWERS_GATES_IN_ADVANCE = _FLAT_AUTOGRAD + '''
import json
import os

import autograder.exercises.beside.gating as gating
import autograder.exercises.beside.ranks as ranks

_KeepsLayers = MiniFSDP


def _ask(digest):
    request, reply = ranks._gate_channel
    os.write(request, (json.dumps({"gate": "backward", "digest": digest}) + "\\n").encode())
    answer = b""
    while not answer.endswith(b"\\n"):
        answer += os.read(reply, 64)
    return float(answer)


class MiniFSDP(_KeepsLayers):
    def forward(self, x):
        if ranks._gate_channel is not None and not getattr(self, "answered", False):
            self.answered, digests, real = True, [], gating.ask_gate
            gating.ask_gate = lambda name, grad: digests.append(ranks.digest(grad))  # silenced: identity
            super().forward(x).float().square().mean().backward()
            self.full_grads.clear()
            answers, scale = [], 1.0
            for total, squares in digests:  # all of them now, holding only shards
                answers.append(_ask([total * scale, squares * scale * scale]))
                scale *= answers[-1]
            gating.ask_gate = lambda name, grad: answers.pop(0) if answers else real(name, grad)
        return super().forward(x)
'''

CORRECT = {
    # the reference's idea in another shape: one flat buffer per layer from list collectives (all_gather, reduce_scatter
    # with ReduceOp.AVG); saved-tensor hooks keep where a gathered parameter was, and backward gathers it again
    "saved_tensor_hooks_list_collectives": '''
import torch
import torch.distributed as dist
from torch import nn


class GatherFlat(torch.autograd.Function):
    """A layer's flat buffer from list collectives; backward averages the flat gradient into the shard."""

    @staticmethod
    def forward(ctx, shard, wrapper, index):
        ctx.wrapper, ctx.index = wrapper, index
        return wrapper.flat(index)

    @staticmethod
    def backward(ctx, grad_flat):
        ws = dist.get_world_size()
        piece = torch.empty(grad_flat.numel() // ws, dtype=torch.float32, device=grad_flat.device)
        dist.reduce_scatter(piece, list(grad_flat.float().chunk(ws)), op=dist.ReduceOp.AVG)
        return piece, None, None


class MiniFSDP(nn.Module):
    def __init__(self, module, param_dtype=None):
        super().__init__()
        self.module = module
        self.param_dtype = param_dtype
        self.ws = dist.get_world_size()
        self.flat_shards = nn.ParameterList()
        self.specs = []
        for layer in module:
            params = dict(layer.named_parameters(recurse=False))
            if not params:
                self.specs.append(None)
                continue
            total = sum(p.numel() for p in params.values())
            per_rank = (total + self.ws - 1) // self.ws
            flat = torch.zeros(per_rank * self.ws)
            flat[:total] = torch.cat([p.detach().reshape(-1) for p in params.values()])
            r = dist.get_rank()
            self.flat_shards.append(nn.Parameter(flat[r * per_rank:(r + 1) * per_rank].clone()))
            self.specs.append((len(self.flat_shards) - 1, [(n, p.shape) for n, p in params.items()]))
            for n in params:
                delattr(layer, n)

    def flat(self, index, dtype="param"):
        shard = self.flat_shards[index].detach()
        if dtype == "param" and self.param_dtype is not None:
            shard = shard.to(self.param_dtype)
        pieces = [torch.empty_like(shard) for _ in range(self.ws)]
        dist.all_gather(pieces, shard)
        return torch.cat(pieces)

    def forward(self, *inputs):
        out = inputs[0] if self.param_dtype is None else inputs[0].to(self.param_dtype)
        for layer, spec in zip(self.module, self.specs):
            if spec is None:
                out = layer(out)
                continue
            index, shapes = spec
            full = GatherFlat.apply(self.flat_shards[index], self, index)
            start = 0
            for name, shape in shapes:
                setattr(layer, name, full[start:start + shape.numel()].view(shape))
                start += shape.numel()
            where = full.untyped_storage().data_ptr()

            def pack(t, where=where, index=index):
                if t.untyped_storage().data_ptr() == where:
                    return index, t.size(), t.stride(), t.storage_offset()
                return t

            def unpack(packed):
                if isinstance(packed, torch.Tensor):
                    return packed
                index, size, stride, offset = packed
                return self.flat(index).as_strided(size, stride, offset)

            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                out = layer(out)
            for name, _ in shapes:
                setattr(layer, name, None)
            del full
        return out

    def finish_gradient_synchronization(self):
        pass

    def gather_full_params(self):
        result = {}
        for (name, layer), spec in zip(self.module.named_children(), self.specs):
            if spec is None:
                continue
            index, shapes = spec
            full = self.flat(index, dtype=torch.float32)
            start = 0
            for pname, shape in shapes:
                result[f"{name}.{pname}"] = full[start:start + shape.numel()].reshape(shape).clone()
                start += shape.numel()
        return result
''',
    # every parameter sharded on its own, torch.func.functional_call, saved-tensor hooks per parameter
    "per_parameter_functional_call": '''
import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call


def gather(shard):
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    dist.all_gather_single(full, shard)
    return full


class AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, dtype):
        return gather(shard.to(dtype))

    @staticmethod
    def backward(ctx, grad_full):
        grad = grad_full.new_empty(grad_full.numel() // dist.get_world_size(), dtype=torch.float32)
        dist.reduce_scatter_single(grad, grad_full.float().contiguous())
        return grad / dist.get_world_size(), None


class MiniFSDP(nn.Module):
    """Every parameter sharded on its own; the layer runs through torch.func.functional_call."""

    def __init__(self, module, param_dtype=None):
        super().__init__()
        self.layers = module
        self.param_dtype = param_dtype
        world, rank = dist.get_world_size(), dist.get_rank()
        self.shards = nn.ParameterDict()
        self.meta = {}
        for lname, layer in module.named_children():
            for pname, p in list(layer.named_parameters(recurse=False)):
                padded = nn.functional.pad(p.detach().reshape(-1), (0, (-p.numel()) % world))
                key = f"{lname}_{pname}"
                self.shards[key] = nn.Parameter(padded.view(world, -1)[rank].clone())
                self.meta[key] = (lname, pname, p.shape)
                layer._parameters.pop(pname)
                setattr(layer, pname, None)

    def forward(self, *inputs):
        x = inputs[0]
        dtype = self.param_dtype or torch.float32
        x = x.to(dtype)
        for lname, layer in self.layers.named_children():
            params, where = {}, {}
            for key, (owner, pname, shape) in self.meta.items():
                if owner == lname:
                    full = AllGather.apply(self.shards[key], dtype)
                    where[full.untyped_storage().data_ptr()] = key
                    params[pname] = full[:shape.numel()].view(shape)

            def pack(t, where=where):
                key = where.get(t.untyped_storage().data_ptr())
                return t if key is None else (key, t.size(), t.stride(), t.storage_offset())

            def unpack(saved, dtype=dtype):
                if isinstance(saved, torch.Tensor):
                    return saved
                key, size, stride, offset = saved
                return gather(self.shards[key].detach().to(dtype)).as_strided(size, stride, offset)

            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                x = functional_call(layer, params, (x,)) if params else layer(x)
            del params
        return x

    def finish_gradient_synchronization(self):
        pass

    def gather_full_params(self):
        out = {}
        for key, (lname, pname, shape) in self.meta.items():
            out[f"{lname}.{pname}"] = gather(self.shards[key].detach())[:shape.numel()].view(shape).clone()
        return out
''',
    # FSDP1's way: the gathered storage is resized to 0 bytes after the forward, a hook on the layer's output gathers
    # it back before the layer's backward, the gradient is reduce-scattered in float32 and the storage freed again
    "resizes_storage_regathers_in_backward_hook": '''
import torch
import torch.distributed as dist
from torch import nn


class _Gather(torch.autograd.Function):
    """All-gather a layer's flat shard; backward reduce-scatters the flat gradient in float32."""

    @staticmethod
    def forward(ctx, shard, fsdp, name):
        ctx.fsdp, ctx.name = fsdp, name
        return fsdp.all_gather(name)

    @staticmethod
    def backward(ctx, grad_flat):
        ctx.fsdp.gathered.pop(ctx.name).resize_(0)  # the layer's backward is done: free its parameters again
        shard, n = ctx.fsdp.shards[ctx.name], ctx.fsdp.world_size
        grad = torch.empty_like(shard)
        dist.reduce_scatter_single(grad, grad_flat.float().contiguous())
        return grad / n, None, None


class MiniFSDP(nn.Module):
    """FSDP1's way: after a layer's forward its gathered storage is resized to 0 bytes; a hook on the layer's
    output gathers it back into the same storage just before the layer's backward."""

    def __init__(self, module, param_dtype=None):
        super().__init__()
        self.module, self.param_dtype = module, param_dtype
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.shards, self.layout, self.gathered = nn.ParameterDict(), {}, {}
        for name, child in module.named_children():
            params = list(child.named_parameters(recurse=False))
            if params:
                self.layout[name] = [(n, p.shape, p.numel()) for n, p in params]
                flat = torch.cat([p.detach().float().reshape(-1) for _, p in params])
                flat = torch.cat([flat, flat.new_zeros(-flat.numel() % self.world_size)])
                self.shards[name] = nn.Parameter(flat.chunk(self.world_size)[self.rank].clone())
                for n, *_ in params:
                    delattr(child, n)

    def all_gather(self, name, dtype=None):
        shard = self.shards[name].detach().to(dtype or self.param_dtype or torch.float32)
        out = shard.new_empty(shard.numel() * self.world_size)
        dist.all_gather_single(out, shard)
        return out

    def forward(self, x):
        if self.param_dtype is not None:
            x = x.to(self.param_dtype)
        for name, child in self.module.named_children():
            if name not in self.shards:
                x = child(x)
                continue
            flat = _Gather.apply(self.shards[name], self, name)
            offset = 0
            for n, shape, numel in self.layout[name]:
                setattr(child, n, flat[offset:offset + numel].view(shape))
                offset += numel
            x = child(x)
            for n, *_ in self.layout[name]:
                setattr(child, n, None)
            storage, nbytes = flat.untyped_storage(), flat.untyped_storage().nbytes()
            storage.resize_(0)  # free the bytes; autograd's saved views keep only the (empty) storage
            self.gathered[name] = storage

            def regather(grad, name=name, storage=storage, nbytes=nbytes):
                storage.resize_(nbytes)  # back into the same storage, before the layer's backward; a storage
                storage.copy_(self.all_gather(name).untyped_storage())  # copy leaves autograd's version count alone
                return grad

            if x.requires_grad:
                x.register_hook(regather)
        return x

    def finish_gradient_synchronization(self):
        pass  # _Gather's backward left each shard's averaged gradient in its .grad

    def gather_full_params(self):
        result = {}
        for name in self.shards:
            flat, offset = self.all_gather(name, dtype=torch.float32), 0
            for n, shape, numel in self.layout[name]:
                result[f"{name}.{n}"] = flat[offset:offset + numel].view(shape).clone()
                offset += numel
        return result
''',
}

# Correct too: it frees each layer after its forward, gathers it again in backward and recomputes the layer there, as
# activation checkpointing does (a check by hooks in the rank saw each layer twice per step and failed it; memory
# measured from outside the ranks passes it).
CORRECT |= {
    "recomputes_layer_in_backward": '''
import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call


class _LayerOnShard(torch.autograd.Function):
    """Run one layer from its shard: gather, compute without a graph, free; backward gathers and recomputes."""

    @staticmethod
    def forward(ctx, x, shard, fsdp, name):
        ctx.fsdp, ctx.name = fsdp, name
        ctx.save_for_backward(x, shard)
        with torch.no_grad():
            return functional_call(fsdp.module.get_submodule(name), fsdp.full_params(name, shard), (x,))

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        fsdp, name = ctx.fsdp, ctx.name
        with torch.enable_grad():
            params = fsdp.full_params(name, shard.detach())
            for p in params.values():
                p.requires_grad_()
            x = x.detach().requires_grad_(x.requires_grad)
            out = functional_call(fsdp.module.get_submodule(name), params, (x,))
            inputs = [x] * x.requires_grad + list(params.values())
            grads = torch.autograd.grad(out, inputs, grad_out)
        grad_x = grads[0] if x.requires_grad else None
        flat = torch.cat([g.float().reshape(-1) for g in grads[-len(params):]])
        flat = nn.functional.pad(flat, (0, shard.numel() * fsdp.world_size - flat.numel()))
        grad_shard = torch.empty_like(shard)
        dist.reduce_scatter_single(grad_shard, flat)
        return grad_x, grad_shard / fsdp.world_size, None, None


class MiniFSDP(nn.Module):
    def __init__(self, module, param_dtype=None):
        super().__init__()
        self.module, self.param_dtype = module, param_dtype
        self.world_size, rank = dist.get_world_size(), dist.get_rank()
        self.shards, self.layout = nn.ParameterDict(), {}
        for name, child in module.named_children():
            params = list(child.named_parameters(recurse=False))
            if params:
                self.layout[name] = [(n, p.shape) for n, p in params]
                flat = torch.cat([p.detach().float().reshape(-1) for _, p in params])
                flat = nn.functional.pad(flat, (0, -flat.numel() % self.world_size))
                self.shards[name] = nn.Parameter(flat.chunk(self.world_size)[rank].clone())
                for n, _ in params:
                    del child._parameters[n]

    def full_params(self, name, shard, dtype="param"):
        shard = shard.to(self.param_dtype if dtype == "param" and self.param_dtype else torch.float32)
        flat = shard.new_empty(shard.numel() * self.world_size)
        dist.all_gather_single(flat, shard.contiguous())
        out, offset = {}, 0
        for n, shape in self.layout[name]:
            out[n] = flat[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
        return out

    def forward(self, x):
        if self.param_dtype is not None:
            x = x.to(self.param_dtype)
        for name, child in self.module.named_children():
            x = _LayerOnShard.apply(x, self.shards[name], self, name) if name in self.shards else child(x)
        return x

    def finish_gradient_synchronization(self):
        pass  # reduce-scattered during backward

    def gather_full_params(self):
        return {f"{name}.{n}": p.clone() for name in self.shards
                for n, p in self.full_params(name, self.shards[name].detach(), dtype="fp32").items()}
''',
}


def _mistake(*replacements: tuple[str, str]) -> str:
    source = _FLAT_AUTOGRAD
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    return source


WRONG = {
    # The old reference's design: the layers' attributes are freed after the forward, but autograd saves the gathered
    # weights for backward, so every layer stays gathered until its backward. Fails a memory check only once the
    # grader measures the ranks' memory (the current one reads the wrapper's attributes and passes it).
    "keeps_gathered_layers_for_backward": (_FLAT_AUTOGRAD, ["memory"]),
    "answers_gates_in_advance": (_ANSWERS_GATES_IN_ADVANCE, ["memory"]),
    # bfloat16 on the wire, but the layers compute in float32 (inputs not cast, weights cast back up): losses within
    # 7e-4 and gradient norms within 5e-3 of FSDP2's, parameters 9e-5 off after 3 steps (bfloat16 styles: exactly 0)
    "computes_in_float32_with_bf16_weights": ('''
import torch
import torch.distributed as dist
from torch import nn


class _Gather(torch.autograd.Function):
    """All-gather a layer's flat shard; backward reduce-scatters the flat gradient in float32."""

    @staticmethod
    def forward(ctx, shard, fsdp, name):
        ctx.fsdp, ctx.name = fsdp, name
        return fsdp.all_gather(name)

    @staticmethod
    def backward(ctx, grad_flat):
        ctx.fsdp.gathered.pop(ctx.name).resize_(0)  # the layer's backward is done: free its parameters again
        shard, n = ctx.fsdp.shards[ctx.name], ctx.fsdp.world_size
        grad = torch.empty_like(shard)
        dist.reduce_scatter_single(grad, grad_flat.float().contiguous())
        return grad / n, None, None


class MiniFSDP(nn.Module):
    """FSDP1's way: after a layer's forward its gathered storage is resized to 0 bytes; a hook on the layer's
    output gathers it back into the same storage just before the layer's backward."""

    def __init__(self, module, param_dtype=None):
        super().__init__()
        self.module, self.param_dtype = module, param_dtype
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.shards, self.layout, self.gathered = nn.ParameterDict(), {}, {}
        for name, child in module.named_children():
            params = list(child.named_parameters(recurse=False))
            if params:
                self.layout[name] = [(n, p.shape, p.numel()) for n, p in params]
                flat = torch.cat([p.detach().float().reshape(-1) for _, p in params])
                flat = torch.cat([flat, flat.new_zeros(-flat.numel() % self.world_size)])
                self.shards[name] = nn.Parameter(flat.chunk(self.world_size)[self.rank].clone())
                for n, *_ in params:
                    delattr(child, n)

    def all_gather(self, name, dtype=None):
        shard = self.shards[name].detach().to(dtype or self.param_dtype or torch.float32)
        out = shard.new_empty(shard.numel() * self.world_size)
        dist.all_gather_single(out, shard)
        return out.float()  # bf16 on the wire, float32 in the layer

    def forward(self, x):
        for name, child in self.module.named_children():
            if name not in self.shards:
                x = child(x)
                continue
            flat = _Gather.apply(self.shards[name], self, name)
            offset = 0
            for n, shape, numel in self.layout[name]:
                setattr(child, n, flat[offset:offset + numel].view(shape))
                offset += numel
            x = child(x)
            for n, *_ in self.layout[name]:
                setattr(child, n, None)
            storage, nbytes = flat.untyped_storage(), flat.untyped_storage().nbytes()
            storage.resize_(0)  # free the bytes; autograd's saved views keep only the (empty) storage
            self.gathered[name] = storage

            def regather(grad, name=name, storage=storage, nbytes=nbytes):
                storage.resize_(nbytes)  # back into the same storage, before the layer's backward; a storage
                storage.copy_(self.all_gather(name).untyped_storage())  # copy leaves autograd's version count alone
                return grad

            if x.requires_grad:
                x.register_hook(regather)
        return x

    def finish_gradient_synchronization(self):
        pass  # _Gather's backward left each shard's averaged gradient in its .grad

    def gather_full_params(self):
        result = {}
        for name in self.shards:
            flat, offset = self.all_gather(name, dtype=torch.float32), 0
            for n, shape, numel in self.layout[name]:
                result[f"{name}.{n}"] = flat[offset:offset + numel].view(shape).clone()
                offset += numel
        return result
''', ["bfloat16"]),
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
                             ["Frees each gathered layer"]),
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
''', ["float32, 2 ranks", "3 ranks", "only its shard", "Frees each gathered layer", "gradient shard"]),
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
