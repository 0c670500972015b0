"""Helpers for Lesson 8 (several dimensions of parallelism at once): what the notebook needs but does not teach.

* ``heads_by_rank``: tensor parallelism splits attention by heads, and ``ColwiseParallel`` gives each rank a
  contiguous block of the fused q/k/v projection's rows. ``coursekit.transformer`` stores those rows as [all q; all k;
  all v], so a contiguous block would mix one rank's queries with another's keys. Megatron-LM stores the fused weight
  head by head for exactly this reason; ``heads_by_rank`` reorders a block's rows the same way for ``tp`` ranks.
* ``SentBytes``: what one rank put on the wire, counted where every back end's sends start. A profiler trace
  (``bytes_sent``) names the operations per back end (``gloo:send``, ``nccl:send 0->1``) and NCCL records a
  ``batch_isend_irecv`` as one ``nccl:coalesced`` without sizes: a ring counted from records named ``send`` sends
  nothing on GPUs.
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


def record_kind(name: str) -> str | None:
    """What a profiler record of a communication back end is, whatever the back end calls it: ``gloo:send``,
    ``nccl:send 0->1`` → ``send``; ``nccl:coalesced`` (NCCL's one record for a batch such as
    ``batch_isend_irecv``) → ``coalesced``; None for anything else."""
    backend, _, kind = name.partition(":")
    if backend not in ("gloo", "nccl", "ucc", "mpi", "xccl") or not kind:
        return None
    return kind.split()[0]


def bytes_sent(prof, world_size: int, element_size: int = 4) -> int:
    """Bytes this rank sent in a profiled region, read from the back end's records: every point-to-point send, and
    the part of every all-to-all's input that goes to other ranks ((N−1)/N of it with even splits). NCCL records a
    batch of point-to-point operations as one ``nccl:coalesced`` without shapes: that raises, since its bytes cannot
    be read there (count them with ``SentBytes`` instead)."""
    total = 0
    for event in prof.events():
        kind = record_kind(event.name)
        values = sum(int(torch.Size(shape).numel()) for shape in event.input_shapes if shape)
        if kind == "send":
            total += values * element_size
        elif kind == "all_to_all":
            total += values * element_size * (world_size - 1) // world_size
        elif kind == "coalesced" and not values:
            raise ValueError(f"{event.name}: a batch of operations recorded without their sizes; use SentBytes")
    return total


class SentBytes:
    """Bytes this rank sends while the ``with`` block runs, counted where every back end's sends start (the process
    group.s ``send`` and ``all_to_all_single``), so that gloo, NCCL and batched operations count alike: each send whole,
    each ``all_to_all_single`` the part of its input that goes to other ranks. ``.bytes`` after the block."""

    def __init__(self):
        self.bytes = 0

    def __enter__(self):
        import torch.distributed as dist

        # the class's own entries (pybind's method descriptors): read through the class they lose their binding
        self._saved = vars(dist.ProcessGroup)["send"], vars(dist.ProcessGroup)["all_to_all_single"]
        send, alltoall = dist.ProcessGroup.send, dist.ProcessGroup.all_to_all_single

        def counted_send(group, tensors, dst, *args, **kwargs):
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
            return send(group, tensors, dst, *args, **kwargs)

        def counted_alltoall(group, output, input, output_splits, input_splits, *args, **kwargs):
            rows = input.size(0) if input.dim() else 1
            row_bytes = input.numel() * input.element_size() // max(rows, 1)
            splits = list(input_splits) or [rows // group.size()] * group.size()
            self.bytes += (sum(splits) - splits[group.rank()]) * row_bytes
            return alltoall(group, output, input, output_splits, input_splits, *args, **kwargs)

        dist.ProcessGroup.send, dist.ProcessGroup.all_to_all_single = counted_send, counted_alltoall
        return self

    def __exit__(self, *exc):
        import torch.distributed as dist

        dist.ProcessGroup.send, dist.ProcessGroup.all_to_all_single = self._saved
        return False
