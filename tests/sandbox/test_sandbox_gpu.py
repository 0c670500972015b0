"""The grader's devices: one decision, made by the trusted grader, for every worker (the reference's and each
student's), shown in the summary line. Tested on the CPU with a fake /dev tree; what needs a real GPU (CUDA
starting inside bubblewrap) is proven on a GPU machine by the grader's own probe, never here.
"""
import os
import resource
import subprocess
import sys
from dataclasses import replace

import pytest

from autograder.grader.batch import BatchSummary
from autograder.grader.sandbox import launch as sandbox_module
from autograder.grader.sandbox.devices import CPU_ONLY, Devices, gpu_candidate, nvidia_device_nodes
from autograder.grader.sandbox.launch import Limits, Sandbox, _bwrap_args, _bwrap_works, make_sandbox

CPU_LINE = "devices: cpu only (no GPU visible to the grader: CUDA scenarios not graded)"


@pytest.fixture
def fake_dev(tmp_path):
    """A /dev with the NVIDIA nodes a one-GPU machine has (plain files), and some that are not CUDA's."""
    root = tmp_path / "dev"
    root.mkdir()
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "null", "nvidiafoo"):
        (root / name).write_text(f"fake {name}\n")
    (root / "nvidia-caps").mkdir()
    (root / "nvidia-caps" / "nvidia-cap1").write_text("")
    return root


def test_the_nvidia_nodes_are_found_under_a_root(fake_dev):
    found = dict(nvidia_device_nodes(fake_dev))
    assert sorted(found.values()) == ["/dev/nvidia-caps", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0",
                                      "/dev/nvidiactl"]
    assert found[str(fake_dev / "nvidia0")] == "/dev/nvidia0"
    (fake_dev / "nvidiactl").unlink()  # a control node and a GPU node, or no GPU at all
    assert nvidia_device_nodes(fake_dev) == () and gpu_candidate(fake_dev) is None
    assert nvidia_device_nodes(fake_dev / "absent") == ()


def test_gpu_workers_get_the_nodes_sys_and_the_loader_cache_cpu_workers_none(fake_dev, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpu = gpu_candidate(fake_dev)
    args = _bwrap_args(Limits(), None, gpu)
    pairs = {(args[i + 1], args[i + 2]) for i, a in enumerate(args) if a == "--dev-bind"}
    assert pairs == set(gpu.nodes) and (str(fake_dev / "nvidia0"), "/dev/nvidia0") in pairs
    assert args.index("--dev-bind") > args.index("--dev")  # bound into the fresh /dev, not hidden by it
    assert ["--ro-bind", "/sys", "/sys"] == args[args.index("/sys") - 1:args.index("/sys") + 2]
    assert ("/etc/ld.so.cache" in args) == os.path.exists("/etc/ld.so.cache")
    assert args[args.index("CUDA_VISIBLE_DEVICES") + 1] == "1"  # passed through from the grader
    cpu = _bwrap_args(Limits(), None, CPU_ONLY)
    assert "--dev-bind" not in cpu and "/sys" not in cpu and "/etc/ld.so.cache" not in cpu
    assert cpu[cpu.index("CUDA_VISIBLE_DEVICES") + 1] == ""  # no worker uses a GPU, even one it could see


def _address_space_limit(sandbox: Sandbox, tmp_path) -> int:
    probe = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0])"
    with sandbox.launch([sys.executable, "-c", probe], str(tmp_path)) as launch:
        run = subprocess.run(launch.command, capture_output=True, text=True, env=launch.env, cwd=tmp_path,
                             preexec_fn=launch.preexec, timeout=60)
    assert run.returncode == 0, run.stderr
    return int(run.stdout)


def test_only_gpu_workers_run_without_the_address_space_limit(fake_dev, tmp_path):
    cpu = Sandbox("rlimits", Limits(memory_bytes=3 << 30), None)
    assert _address_space_limit(cpu, tmp_path) == 3 << 30
    gpu = replace(cpu, devices=replace(gpu_candidate(fake_dev), names=("Fake GPU",)))
    assert _address_space_limit(gpu, tmp_path) == resource.getrlimit(resource.RLIMIT_AS)[0]
    assert cpu.fingerprint() != gpu.fingerprint()  # results saved on the CPU only are graded again with a GPU


@pytest.mark.skipif(not _bwrap_works(), reason="bubblewrap cannot create namespaces here")
def test_a_worker_in_bubblewrap_sees_exactly_the_bound_device_nodes(fake_dev, tmp_path):
    look = ("import os; print(sorted(n for n in os.listdir('/dev') if n.startswith('nvidia')), "
            "open('/dev/nvidia0').read().strip(), repr(os.environ.get('CUDA_VISIBLE_DEVICES')), os.path.isdir('/sys/bus'))")
    for devices, seen in ((replace(gpu_candidate(fake_dev), visible=None),
                           "['nvidia-caps', 'nvidia-uvm', 'nvidia-uvm-tools', 'nvidia0', 'nvidiactl'] fake nvidia0 None True"),
                          (CPU_ONLY, None)):
        sandbox = replace(make_sandbox(gpu=False), devices=devices)
        with sandbox.launch([sys.executable, "-c", look], str(tmp_path)) as launch:
            run = subprocess.run(launch.command, capture_output=True, text=True, env=launch.env, cwd=tmp_path,
                                 preexec_fn=launch.preexec, timeout=60)
        if seen:
            assert run.returncode == 0 and run.stdout.strip() == seen, run.stdout + run.stderr
        else:  # the CPU-only sandbox has no NVIDIA node to open
            assert run.returncode != 0 and "nvidia0" in run.stderr


def test_this_cpu_machine_grades_on_the_cpu_and_says_so():
    sandbox = make_sandbox()
    assert sandbox.devices == CPU_ONLY or not os.path.exists("/dev/nvidiactl")
    assert f"devices: {sandbox.devices.describe()}" == CPU_LINE
    assert CPU_LINE in BatchSummary(devices=sandbox.devices.describe()).line()
    off = make_sandbox(gpu=False)
    assert off.devices.describe() == "cpu only (GPU grading turned off with --cpu-only: CUDA scenarios not graded)"
    assert Devices(cuda=True, names=("NVIDIA H200",)).describe() == "cpu + cuda (NVIDIA H200)"


def test_a_gpu_where_cuda_cannot_start_is_tried_in_a_worker_and_graded_on_the_cpu(fake_dev, monkeypatch):
    """Fake device nodes, a CPU-only torch: the probe worker (same isolation, the nodes bound, no address-space
    limit) cannot start CUDA, so every worker gets the CPU only and the warning says why. The grader process
    itself never starts CUDA: its lazy init and device count raise here."""
    import torch

    def no_cuda_here(*_, **__):
        raise AssertionError("the grader process must not start CUDA")

    monkeypatch.setattr(torch.cuda, "_lazy_init", no_cuda_here)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", no_cuda_here, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", no_cuda_here)
    sandbox = make_sandbox(dev_root=str(fake_dev))
    assert not sandbox.devices.cuda and sandbox.devices.reason == "CUDA did not start in a grading worker"
    assert "CUDA did not start in a grading worker" in sandbox.warning and "sees no GPU" in sandbox.warning
    assert "CUDA scenarios not graded" in sandbox.devices.describe() and "nvidia-uvm does not exist" not in sandbox.warning


def test_a_usable_gpu_is_given_to_every_worker_alike(fake_dev, monkeypatch):
    """The reference's worker and every student's get the one sandbox decided up front (its devices included)."""
    probed = []
    monkeypatch.setattr(sandbox_module, "probe_devices", lambda s: probed.append(s.devices) or (("Fake GPU",), ""))
    sandbox = make_sandbox(dev_root=str(fake_dev))
    assert sandbox.devices.cuda and sandbox.devices.describe() == "cpu + cuda (Fake GPU)"
    assert probed and probed[0].nodes == sandbox.devices.nodes  # the probe ran with exactly the workers' devices
    if not sandbox.cgroups.backend:
        assert "no cgroup bounds their memory" in sandbox.warning
    assert sandbox.__reduce__()[1][-1] == sandbox.devices  # Dask workers unpickle the same devices


def test_reference_and_students_are_observed_with_the_same_sandbox(tmp_path, monkeypatch):
    """grade_class passes its one sandbox to the reference's observation and to every student's tasks."""
    from submission_factory import filled, reference_source, write

    from autograder.grader import batch, isolation, references
    from autograder.grader.messages import TaskResult

    seen = []

    def fake_run_tasks(tasks, sandbox, as_reference=False):
        seen.append((as_reference, sandbox))
        return {t.key: TaskResult(t.key, "ok", {"salt": t.salt, "scenarios": {}}, "", "") if as_reference
                else TaskResult(t.key, "failed", None, "not run in this test", "") for t in tasks}, 0.0

    for module in (isolation, references):  # students' tasks and the reference's
        monkeypatch.setattr(module, "run_tasks", fake_run_tasks)
    for student in ("ann", "ben"):
        exercise = "train_with_accumulation"
        write(tmp_path / "in", student, "01_gradient_accumulation.ipynb",
              filled("01_gradient_accumulation.ipynb", {exercise: reference_source(exercise)}))
    sandbox = replace(Sandbox("off", Limits(), None), devices=Devices(cuda=True, names=("Fake GPU",)))
    _, summary = batch.grade_class(tmp_path / "in", tmp_path / "out", sandbox, jobs=2, progress=False)
    assert [r for r, _ in seen].count(True) == 1 and [r for r, _ in seen].count(False) == 2
    assert all(s is sandbox for _, s in seen)
    assert summary.line().endswith("devices: cpu + cuda (Fake GPU)")


def test_a_dask_worker_without_the_graders_gpu_stops_the_batch_with_a_reason():
    from autograder.grader.cluster import _remote_sandbox

    assert not _remote_sandbox(True, Limits(), None, False).devices.cuda
    if not os.path.exists("/dev/nvidiactl"):
        with pytest.raises(RuntimeError, match="references were observed with a GPU"):
            _remote_sandbox(True, Limits(), None, True)
