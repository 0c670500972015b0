"""Helpers for Lesson 8 (several dimensions of parallelism at once): what the notebook needs but does not teach.

* ``heads_by_rank``: tensor parallelism splits attention by heads, and ``ColwiseParallel`` gives each rank a
  contiguous block of the fused q/k/v projection's rows. ``coursekit.transformer`` stores those rows as [all q; all k;
  all v], so a contiguous block would mix one rank's queries with another's keys. Megatron-LM stores the fused weight
  head by head for exactly this reason; ``heads_by_rank`` reorders a block's rows the same way for ``tp`` ranks.
* ``bytes_sent``: what one rank put on the wire, from a profiler trace (torch's profiler records every gloo
  operation as ``gloo:<kind>`` with the shape of its input).
"""
import torch


def qkv_rows_by_rank(n_embd: int, tp: int) -> torch.Tensor:
    """The row order [q₀ k₀ v₀ | q₁ k₁ v₁ | …]: rank r's heads' rows of q, k and v side by side."""
    if n_embd % tp:
        raise ValueError(f"n_embd = {n_embd} is not divisible by tp = {tp}")
    width = n_embd // tp
    return torch.cat([torch.arange(width) + part * n_embd + r * width for r in range(tp) for part in range(3)])


def heads_by_rank(block, tp: int):
    """Reorder ``block.attn.qkv``'s rows (in place) so that a contiguous split into ``tp`` parts gives each rank the
    q, k and v rows of its own heads. The block then computes the same function only under tensor parallelism
    (``tp`` ranks, ``ColwiseParallel`` on ``attn.qkv``); returns the block."""
    if block.attn.n_head % tp:
        raise ValueError(f"{block.attn.n_head} heads cannot be split over tp = {tp} ranks")
    order = qkv_rows_by_rank(block.attn.qkv.in_features, tp)
    with torch.no_grad():
        block.attn.qkv.weight.copy_(block.attn.qkv.weight[order])
        if block.attn.qkv.bias is not None:
            block.attn.qkv.bias.copy_(block.attn.qkv.bias[order])
    return block


def bytes_sent(prof, world_size: int, element_size: int = 4) -> int:
    """Bytes this rank sent in a profiled region: every point-to-point send, and the part of every all-to-all's
    input that goes to other ranks ((N−1)/N of it with even splits). Other collectives are not counted. The back end
    names its operations ``gloo:send``, ``nccl:send``, …"""
    total = 0
    for event in prof.events():
        backend, _, kind = event.name.partition(":")
        if backend not in ("gloo", "nccl"):
            continue
        values = sum(int(torch.Size(shape).numel()) for shape in event.input_shapes if shape)
        if kind == "send":
            total += values * element_size
        elif kind == "all_to_all":
            total += values * element_size * (world_size - 1) // world_size
    return total
