"""Which devices the grading workers get: the CPU, and a CUDA GPU where every worker can use the same one.

The trusted grader decides once, before any worker starts, and every worker gets that decision: the
reference's and each student's alike. Otherwise a GPU the reference could use and a student's sandbox
could not (or the other way round) would cost correct students points for the grader's failure.

* **Which GPU**: the NVIDIA device nodes under ``/dev`` (``nvidiactl``, ``nvidia-uvm*``, ``nvidia0``…,
  ``nvidia-caps``); ``launch.py`` binds them into the worker's fresh ``/dev`` and then proves, with a short
  probe in a worker exactly like a grading one, that CUDA starts there. The grader itself never touches CUDA.
* **No GPU** (none, ``--cpu-only``, or CUDA did not start in the probe): every worker gets
  ``CUDA_VISIBLE_DEVICES=""``, so no worker uses a GPU even where one is visible (``--no-sandbox``, rlimits only).

The class summary line says which, e.g. "devices: cpu + cuda (NVIDIA H200)".
"""
import os
import re
from dataclasses import dataclass
from pathlib import Path

NODE = re.compile(r"nvidiactl|nvidia-uvm.*|nvidia[0-9]+|nvidia-caps")
NO_GPU = "no GPU visible to the grader"


@dataclass(frozen=True)
class Devices:
    cuda: bool = False
    nodes: tuple[tuple[str, str], ...] = ()   # (host path, path inside the sandbox) of each device node to bind
    visible: str | None = None                # CUDA_VISIBLE_DEVICES for GPU workers (None: all the grader sees)
    names: tuple[str, ...] = ()               # the GPUs' names, from the probe
    reason: str = NO_GPU                      # why the CPU only

    def describe(self) -> str:
        if self.cuda:
            return f"cpu + cuda ({', '.join(self.names) or 'GPU'})"
        return f"cpu only ({self.reason}: CUDA scenarios not graded)"

    def env(self) -> dict[str, str]:
        """What every worker's environment gets: the GPUs it may use, or none at all."""
        if not self.cuda:
            return {"CUDA_VISIBLE_DEVICES": ""}
        return {"CUDA_VISIBLE_DEVICES": self.visible} if self.visible is not None else {}


CPU_ONLY = Devices()


def nvidia_device_nodes(root: str | Path = "/dev") -> tuple[tuple[str, str], ...]:
    """The NVIDIA device nodes under ``root`` as (host path, ``/dev/<name>``), or () unless there is a control
    node and at least one GPU node. ``root`` is a parameter so that a test can point it at a fake tree."""
    try:
        names = sorted(n for n in os.listdir(root) if NODE.fullmatch(n))
    except OSError:
        return ()
    if "nvidiactl" not in names or not any(re.fullmatch(r"nvidia[0-9]+", n) for n in names):
        return ()
    return tuple((str(Path(root, n)), f"/dev/{n}") for n in names)


def gpu_candidate(root: str | Path = "/dev") -> Devices | None:
    """The GPU devices to try (before the probe), or None when this machine shows none."""
    nodes = nvidia_device_nodes(root)
    if not nodes:
        return None
    return Devices(cuda=True, nodes=nodes, visible=os.environ.get("CUDA_VISIBLE_DEVICES"))


# Run in a worker exactly like a grading one: import what the worker imports before it forks (that must not
# start CUDA: a forked task could not use it then), then fork and use the GPU in the child, as a task does.
PROBE = r"""
import importlib, json, os, sys
import torch
from autograder.exercises import all_exercises
from autograder.exercises.beside.observing import observer_of
torch.set_num_threads(1)
for exercise in all_exercises().values():
    observer_of(exercise)
importlib.import_module("torch._dynamo")
if torch.cuda.is_initialized():
    print(json.dumps({"error": "importing the grader's worker modules started CUDA before the tasks fork"}))
    sys.exit()
read_fd, write_fd = os.pipe()
if os.fork() == 0:
    try:
        count = torch.cuda.device_count()
        if not count:
            raise RuntimeError(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU")
        names = [torch.cuda.get_device_name(i) for i in range(count)]
        assert torch.ones(4, device="cuda").sum().item() == 4
        message = {"names": names}
    except BaseException as exc:
        message = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    os.write(write_fd, json.dumps(message).encode())
    os._exit(0)
os.close(write_fd)
data = b""
while chunk := os.read(read_fd, 65536):
    data += chunk
os.wait()
print(data.decode() or json.dumps({"error": "the probe's child sent nothing"}))
"""
