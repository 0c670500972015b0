"""Libraries an exercise asks students to write themselves, made absent from the students' sandboxes.

Detecting their use by walking the student's objects is easy to hide (issue 25), so in a student's worker they are
not there: one stub (``stubs/stub-package/__init__.py``) is bound read-only over each file or folder below, and an
empty file over every compiled copy of a replaced file (else ``SourcelessFileLoader`` would load the original from
``__pycache__``). The names torch itself imports stay importable; using one raises "... is switched off in the
grader's sandbox". Binds are mount points, so they are in place before the worker imports torch, and submitted code
cannot undo them (a mount namespace it makes inside the sandbox keeps them locked).

The reference worker keeps the real libraries: its ground truths train with DDP and FSDP2. So does a student's
worker for an exercise that needs one of them for its own method (``Exercise.needs_libraries``: Lesson 9's
checkpoints of an FSDP2 model), in a worker of its own.

The files are looked up in the installed torch when the sandbox is made; a path this torch no longer has is left
out and named in the warning, and ``probe.py`` proves in a worker exactly like a student's that torch still imports
and compiles with the stubs and that each library really raises (else the stubs are not used, with a warning).
"""
import importlib.util
from dataclasses import dataclass
from pathlib import Path

STUBS = Path(__file__).resolve().parent / "stubs"
STUB_PACKAGE = STUBS / "stub-package"     # a folder holding only the stub as __init__.py
STUB_MODULE = STUB_PACKAGE / "__init__.py"
EMPTY = STUBS / "empty"

# Under the folder holding torch. A folder is replaced whole, so none of its submodules (or their .pyc) is left.
FORBIDDEN = (
    "torch/nn/parallel/distributed.py",                      # DistributedDataParallel
    "torch/distributed/fsdp",                                # fully_shard, FullyShardedDataParallel
    "torch/distributed/tensor/parallel",                     # parallelize_module, ColwiseParallel, ...
    "torch/distributed/_composable/replicate.py",            # replicate (composable DDP)
    "torch/distributed/_composable/replicate_with_fsdp.py",  # replicate built on FSDP2
    "torch/distributed/optim/zero_redundancy_optimizer.py",  # ZeroRedundancyOptimizer
)

# What the probe tries in a student's sandbox: each must raise the stub's message.
USES = {
    "DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel(model)",
    "fully_shard": "from torch.distributed.fsdp import fully_shard; fully_shard(model)",
    "FullyShardedDataParallel": "from torch.distributed.fsdp import FullyShardedDataParallel as F; F(model)",
    "composable fully_shard": "from torch.distributed._composable.fsdp import fully_shard; fully_shard(model)",
    "parallelize_module": "from torch.distributed.tensor.parallel import parallelize_module; parallelize_module(model, None, {})",
    "ColwiseParallel": "from torch.distributed.tensor.parallel import ColwiseParallel; ColwiseParallel()",
    "replicate": "from torch.distributed._composable import replicate; replicate(model)",
    "ZeroRedundancyOptimizer":
        "from torch.distributed.optim import ZeroRedundancyOptimizer as Z; Z(model.parameters(), torch.optim.SGD)",
}
SWITCHED_OFF = "is switched off in the grader's sandbox"


@dataclass(frozen=True)
class Stubs:
    binds: tuple[tuple[str, str], ...] = ()   # (stub on the host, the path it covers), in bind order
    missing: tuple[str, ...] = ()             # forbidden paths this torch does not have
    reason: str = ""                          # why no stubs at all ("" when some are bound)

    def args(self) -> list[str]:
        """bubblewrap arguments, after the read-only binds of the Python trees they cover."""
        return [arg for stub, target in self.binds for arg in ("--ro-bind", stub, target)]

    def without(self, libraries: tuple[str, ...]) -> "Stubs":
        """These stubs except the ones over ``libraries`` (``FORBIDDEN`` entries), for an exercise that needs them."""
        def covers(target: str) -> bool:
            path = Path(target)
            if path.parent.name == "__pycache__":  # a compiled copy of a replaced file
                path = path.parent.parent / (path.name.split(".")[0] + ".py")
            return any(str(path).endswith("/" + library) for library in libraries)

        kept = tuple(bind for bind in self.binds if not covers(bind[1]))
        return Stubs(kept, self.missing, self.reason or ("" if kept else "an exercise needs every forbidden library"))

    def describe(self) -> str:
        if not self.binds:
            return f"forbidden libraries importable ({self.reason})"
        return "forbidden libraries switched off" + (f" except {', '.join(self.missing)}" if self.missing else "")


def torch_folder() -> Path | None:
    """The folder holding the torch package the workers import (found without importing torch)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).resolve().parent.parent


def locate(site: Path | None = None) -> Stubs:
    """The binds that switch the forbidden libraries off in this installation of torch."""
    site = site or torch_folder()
    if site is None:
        return Stubs(reason="torch is not installed where the grader runs")
    binds, missing = [], []
    for relative in FORBIDDEN:
        target = site / relative
        if relative.endswith(".py") and target.is_file():
            binds.append((str(STUB_MODULE), str(target)))
            binds += [(str(EMPTY), str(pyc)) for pyc in sorted((target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"))]
        elif not relative.endswith(".py") and target.is_dir():
            binds.append((str(STUB_PACKAGE), str(target)))
        else:
            missing.append(relative)
    return Stubs(tuple(binds), tuple(missing), "" if binds else "none of them is where this torch keeps it")
