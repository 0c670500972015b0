"""The grader's stand-in for a library an exercise asks students to write themselves (see ``forbidden.py``).

Bound read-only over the library's file or folder in a student's sandbox only. Every name torch imports from it
still exists (torch.nn imports DistributedDataParallel, torch._dynamo and torch.compile reach fsdp and
tensor.parallel), but calling or constructing any of them raises; the library's submodules are absent.
"""
NAMES = {  # the module this file stands in for -> what students know it as
    "torch.nn.parallel.distributed": "torch's DistributedDataParallel",
    "torch.distributed.fsdp": "torch's FSDP (fully_shard, FullyShardedDataParallel)",
    "torch.distributed.tensor.parallel": "torch's tensor parallelism (parallelize_module, ColwiseParallel, ...)",
    "torch.distributed._composable.replicate": "torch's replicate",
    "torch.distributed._composable.replicate_with_fsdp": "torch's replicate",
    "torch.distributed.optim.zero_redundancy_optimizer": "torch's ZeroRedundancyOptimizer",
}
MESSAGE = (f"{NAMES.get(__name__, __name__)} is switched off in the grader's sandbox: this exercise asks you to write "
           "it yourself (your notebook can still use it; only graded code cannot).")


class ParallelStyle:
    """A plain base class: torch.compile imports it (context parallel subclasses it) whether or not TP is used."""


class _Unusable:
    def __new__(cls, *args, **kwargs):
        raise RuntimeError(MESSAGE)

    @classmethod
    def _get_active_ddp_module(cls):  # torch._dynamo asks DistributedDataParallel on every compiled frame
        return None


_made = {}


def __getattr__(name: str):
    """Any other name is a class nobody can construct or call (functions such as fully_shard included)."""
    if name.startswith("__"):
        raise AttributeError(name)
    if name not in _made:
        _made[name] = type(name, (_Unusable,), {"__module__": __name__})
    return _made[name]
