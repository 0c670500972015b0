"""Every CUDA path the course takes, proven on the CPU where it can be.

* The GPU command (``python3 -m bench.gpu_evidence --out DIR``): its CPU dry run writes both results files and
  its log into DIR within its bounds; with one rank it records no bandwidth and says which sections need more
  GPUs; the recorder's own process never initialises CUDA; it needs nothing but the standard library and torch,
  and its make target installs nothing.
* The recorded sections and the lessons agree: every ``show_recorded`` key is recorded, every section is shown.
* The profiler breakdown (Lessons 3 and 6, and the recorder) on synthetic GPU events: annotations, NCCL kernels
  of every naming generation, copies and matrix products.
* Every CUDA API the lessons, helpers, recorder and grader call exists in the pinned torch.
"""
import ast
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from bench.gpu_evidence import RESULTS, SECTIONS
from coursekit import recorded
from coursekit.profiling import intersection, is_collective_work, length, step_breakdown, subtract, union

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((REPO / "solutions").rglob("*.ipynb"))


def record(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "bench.gpu_evidence", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.glob("*")} if folder.exists() else {}


def code_cells(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


# ---- the GPU command, dry run on the CPU ------------------------------------------------------------------

@pytest.mark.slow
def test_dry_run_writes_results_and_log_into_the_folder_within_its_bounds(tmp_path):
    committed = snapshot(RESULTS)
    started = time.monotonic()
    done = record("--dry-run", "--out", str(tmp_path), "--timeout", "90", "--total-timeout", "240")
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert seconds < 240 + 20, f"the dry run took {seconds:.0f} s, past its total bound"
    assert snapshot(RESULTS) == committed, "a dry run must never touch coursekit/results"
    for name in ("gpu_evidence.json", "gpu_evidence.md", "gpu_evidence.log"):
        assert 0 < (tmp_path / name).stat().st_size < 4 << 20, name
    log = (tmp_path / "gpu_evidence.log").read_text()
    assert all(f"[{name}]" in log for name in SECTIONS), log[-2000:]

    results = json.loads((tmp_path / "gpu_evidence.json").read_text())
    prov = results["provenance"]
    assert prov["dry_run"] is True and prov["torch"] == torch.__version__ and prov["sources sha256"]
    assert prov["warnings"] == [], "the pinned torch runs the tests: no warning expected"
    for name in SECTIONS:
        entry = results[name]
        assert "DRY RUN" in entry["device"] and "NOT GPU evidence" in entry["device"], name
        assert entry["rows"] and all(isinstance(r, dict) for r in entry["rows"]), name
        assert {"torch", "date", "setup", "notes"} <= set(entry), name
    text = (tmp_path / "gpu_evidence.md").read_text()
    assert all(f"(`{name}`)" in text for name in SECTIONS)

    # The numbers follow the definitions they claim (on any device).
    for row in results["lesson3_allreduce"]["rows"]:
        n = row["ranks"]
        assert n >= 2
        assert row["algbw GB/s"] == pytest.approx(row["bytes"] / (row["time us"] * 1e-6) / 1e9)
        assert row["busbw GB/s"] == pytest.approx(row["algbw GB/s"] * 2 * (n - 1) / n)
    for row in results["lesson6_comm_share"]["rows"]:
        parts = sum(row[f"{k} %"] for k in ("compute only", "overlapped", "exposed comm", "idle"))
        assert parts == pytest.approx(100, abs=1e-6)
    fsdp = {(r["setup"], r["ranks"]): r for r in results["lesson5_fsdp_zero"]["rows"]}
    assert fsdp["FSDP2", 2]["state MiB (measured)"] == pytest.approx(fsdp["DDP", 2]["state MiB (measured)"] / 2)
    assert fsdp["DDP", 2]["state MiB (measured)"] == pytest.approx(fsdp["DDP", 2]["state MiB (ZeRO formula)"])
    assert {r["dtype"] for r in results["lesson6_mfu"]["rows"]} == {"float32", "bfloat16", "float16"}


@pytest.mark.slow
def test_one_rank_records_no_bandwidth_and_says_which_sections_need_more_gpus(tmp_path, monkeypatch, capsys):
    done = record("--dry-run", "--ranks", "1", "--out", str(tmp_path), "--only", "lesson3_allreduce",
                  "lesson3_data_parallel", "lesson4_pipeline_parallel", "lesson5_fsdp_zero", "lesson6_comm_share")
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "gpu_evidence.json").read_text())
    for name in ("lesson3_allreduce", "lesson3_data_parallel", "lesson4_pipeline_parallel", "lesson5_fsdp_zero"):
        assert results[name]["needs GPUs"] == 2 and results[name]["gpus"] == 1 and results[name]["rows"] == [], name
    assert "GB/s" not in json.dumps(results), "no bandwidth may be recorded for a one-rank all-reduce"
    assert {r["ranks"] for r in results["lesson6_comm_share"]["rows"]} == {1}, "one rank: single-rank profiles only"

    monkeypatch.setattr(recorded, "EVIDENCE", tmp_path / "gpu_evidence.json")
    recorded.show_recorded("lesson3_allreduce", "All-reduce bandwidth on GPUs")
    assert "needs ≥ 2 GPUs; not recorded" in capsys.readouterr().out


@pytest.mark.slow
def test_the_recorder_process_never_initialises_cuda(tmp_path):
    """Its lazy CUDA initialisation raises in the recorder's own process: a dry run still completes, so nothing
    there created a CUDA context (forked ranks could not use CUDA afterwards)."""
    script = f"""
import sys, torch
def refuse(*args, **kwargs):
    raise RuntimeError("the recorder's own process initialised CUDA")
torch.cuda._lazy_init = torch.cuda.init = refuse
from bench.evidence_record import main
code = main(["--dry-run", "--ranks", "1", "--out", {str(tmp_path)!r}, "--only", "lesson1_accumulation",
             "lesson2_amp", "lesson6_comm_share", "lesson6_mfu"])
assert not torch.cuda.is_initialized()
sys.exit(code)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "initialised CUDA" not in done.stdout + done.stderr


def _sleep_forever(rank, world_size):
    time.sleep(3600)


def test_a_section_past_its_time_bound_is_stopped_and_the_others_still_run(tmp_path, monkeypatch):
    from bench import evidence_record, evidence_single

    monkeypatch.setitem(SECTIONS, "hang", ("a section whose ranks never finish", 1, "evidence_single"))
    monkeypatch.setitem(SECTIONS, "quick", ("a section after it", 1, "evidence_single"))
    monkeypatch.setattr(evidence_single, "hang", lambda plan: plan.run(_sleep_forever, 1), raising=False)
    monkeypatch.setattr(evidence_single, "quick", lambda plan: {"rows": [{"n": 1}], "setup": "", "notes": ""},
                        raising=False)
    started = time.monotonic()
    code = evidence_record.main(["--dry-run", "--ranks", "1", "--out", str(tmp_path), "--timeout", "3",
                                 "--only", "hang", "quick"])
    assert code == 1 and time.monotonic() - started < 120
    results = json.loads((tmp_path / "gpu_evidence.json").read_text())
    assert "still running after 3 s" in results["provenance"]["failed"]["hang"]
    assert "hang" not in results and results["quick"]["rows"] == [{"n": 1}]


def test_the_supervisor_imports_no_torch_and_the_commit_comes_from_the_environment(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import sys, bench.gpu_evidence; print('torch' in sys.modules)"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
    script = "from bench.evidence_record import commit; print(commit())"
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PATH": str(tmp_path), "GPU_EVIDENCE_COMMIT": "abc1234"})  # no git on this PATH
    assert done.stdout.strip() == "abc1234", done.stderr


def test_a_torch_other_than_the_pin_is_recorded_as_a_warning(monkeypatch):
    from bench import evidence_record
    from bench.evidence_common import Plan

    monkeypatch.setattr(evidence_record, "launch", lambda *a, **k: [{"device": "test", "cuda": None}])
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    prov = evidence_record.provenance(Plan(dry_run=False, ranks=1), 1, [])
    assert prov["warnings"] == [f"recorded with torch 2.11.0+cu130; the course pins {evidence_record.pinned_torch()}"]
    assert evidence_record._entry(prov, rows=[])["warning"] == prov["warnings"][0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_real_command_refuses_and_says_why(tmp_path):
    done = record("--out", str(tmp_path), timeout=120)
    assert done.returncode == 2
    assert "No CUDA GPU is visible" in done.stdout and "--dry-run" in done.stdout
    assert "No CUDA GPU is visible" in (tmp_path / "gpu_evidence.log").read_text()
    assert "wrote no results" in json.loads((tmp_path / "gpu_evidence.json").read_text())["provenance"]["error"]


def imports(path: Path):
    """(top-level package, its module or None) of every import statement in a file, lazy ones included."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield (alias.name.split(".") + [None])[:2]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: a module of the file's own package
                yield path.parent.name, (node.module or "").split(".")[0] or None
            else:
                yield (node.module.split(".") + [None])[:2]


def test_the_gpu_command_installs_nothing():
    """`make gpu-evidence` runs with whatever python3 holds torch: no venv, no pip, and the code it runs imports
    only the standard library, torch and the course's own packages (bench, coursekit)."""
    makefile = (REPO / "Makefile").read_text()
    rule = re.search(r"^gpu-evidence:(.*)\n((?:\t.*\n)+)", makefile, re.M)
    assert rule, "no gpu-evidence target"
    prerequisites, recipe = rule.group(1), rule.group(2)
    assert "env" not in prerequisites.split() and "VENV" not in prerequisites
    assert not re.search(r"pip|venv|install|\$\(PY\)", recipe), recipe
    assert "-m bench.gpu_evidence --out" in recipe
    readme = (REPO / "README.md").read_text()
    assert "python3 -m bench.gpu_evidence --out" in readme

    allowed = set(sys.stdlib_module_names) | {"torch", "bench", "coursekit"}
    todo = [REPO / "bench" / f"{m}.py" for m in {"gpu_evidence", "evidence_record", *(m for _, _, m in SECTIONS.values())}]
    seen, outside = set(), {}
    while todo:
        path = todo.pop()
        if path in seen or not path.exists():
            continue
        seen.add(path)
        for package, module in imports(path):
            if package not in allowed:
                outside.setdefault(path.name, set()).add(package)
            elif package in ("bench", "coursekit"):
                todo += [REPO / package / "__init__.py", REPO / package / f"{module}.py"]
    assert not outside, f"the GPU command would need packages a bare GPU machine may lack: {outside}"
    assert REPO / "coursekit" / "pipeline.py" in seen and REPO / "coursekit" / "sharding.py" in seen


# ---- the lessons and the recorder agree ---------------------------------------------------------------------

def shown_sections() -> dict[str, str]:
    """section key → notebook, for every show_recorded call in the instructor notebooks."""
    shown = {}
    for path in SOLUTIONS:
        code = "\n".join(code_cells(path))
        for arg in re.findall(r"show_recorded\(\s*([^,\s)]+)", code):
            if arg[0] in "\"'":
                key = ast.literal_eval(arg)
            else:  # a constant imported from coursekit: `from coursekit.X import ..., NAME`
                module = re.search(rf"from (coursekit[\w.]*) import [^\n]*\b{arg}\b", code).group(1)
                key = getattr(__import__(module, fromlist=[arg]), arg)
            shown[key] = path.name
    return shown


def test_every_recorded_section_is_shown_by_a_lesson_and_every_shown_key_is_recorded():
    shown = shown_sections()
    assert set(shown) == set(SECTIONS), (f"shown but never recorded: {sorted(set(shown) - set(SECTIONS))}; "
                                         f"recorded but shown by no lesson: {sorted(set(SECTIONS) - set(shown))}")


# ---- the profiler breakdown on synthetic GPU events --------------------------------------------------------

NCCL_KERNELS = ["ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)",
                "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
                "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"]
COMPUTE_KERNELS = ["sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off",
                   "ampere_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>",
                   "Memcpy HtoD (Pageable -> Device)", "Memcpy DtoD (Device -> Device)", "Memset (Device)"]


def event(name, start, end, device=DeviceType.CPU, annotation=False):
    return FunctionEvent(id=0, name=name, thread=1, start_us=start, end_us=end, device_type=device,
                         is_user_annotation=annotation)


class Profile:
    def __init__(self, events):
        self._events = events

    def events(self):
        return self._events


def gpu_step(nccl: str, flag_annotations: bool = True) -> Profile:
    """A 100 µs step: compute kernels 0-20 (a gemm) and 20-30 (a copy), NCCL alone 30-50, nothing 50-100; on the
    GPU timeline the profiler's annotations train_step (0-70) and nccl:all_reduce (30-50) span that work."""
    gpu = DeviceType.CUDA
    return Profile([event("train_step", 0, 100), event("aten::mm", 1, 5), event("nccl:all_reduce", 6, 9),
                    event(COMPUTE_KERNELS[0], 0, 20, gpu), event(COMPUTE_KERNELS[3], 20, 30, gpu), event(nccl, 30, 50, gpu),
                    event("train_step", 0, 70, gpu, flag_annotations), event("nccl:all_reduce", 30, 50, gpu, flag_annotations)])


@pytest.mark.parametrize("nccl", NCCL_KERNELS)
@pytest.mark.parametrize("flagged", [True, False], ids=["is_user_annotation", "older torch: no flag"])
def test_gpu_annotations_are_not_work_and_every_nccl_kernel_is_communication(nccl, flagged):
    (step,) = step_breakdown(gpu_step(nccl, flagged))
    assert step == pytest.approx({"step ms": 0.1, "compute only": 0.03, "overlapped": 0.0, "exposed comm": 0.02,
                                  "idle": 0.05})


def test_overlap_of_a_gemm_and_an_nccl_kernel():
    gpu = DeviceType.CUDA
    prof = Profile([event("train_step", 0, 100), event(COMPUTE_KERNELS[1], 10, 60, gpu),
                    event(NCCL_KERNELS[0], 40, 80, gpu), event("train_step", 5, 85, gpu, True)])
    (step,) = step_breakdown(prof)
    assert step == pytest.approx({"step ms": 0.1, "compute only": 0.03, "overlapped": 0.02, "exposed comm": 0.02,
                                  "idle": 0.03})


def lesson3_matcher():
    """Lesson 3's all-reduce matcher, as the notebook defines or imports it (it must be coursekit's)."""
    code = "\n".join(code_cells(REPO / "solutions" / "lesson3" / "03_data_parallel.ipynb"))
    assert not re.search(r"^def is_allreduce", code, re.M), "Lesson 3 must use coursekit's matcher, not its own copy"
    imported = re.search(r"from coursekit\.profiling import ([^\n]*)", code)
    assert imported and re.search(r"\b(is_collective_work|backward_overlap)\b", imported.group(1)), code[:300]
    return is_collective_work  # what backward_overlap sorts the profiler's events with


def test_lesson3_matcher_is_the_helper_and_knows_every_nccl_generation():
    matcher = lesson3_matcher()
    assert all(matcher(name) for name in NCCL_KERNELS + ["gloo:all_reduce"])
    assert not any(matcher(name) for name in COMPUTE_KERNELS + ["nccl:all_reduce", "c10d::allreduce_", "aten::mm"])


def test_interval_arithmetic():
    assert union([(3, 4), (0, 2), (1, 3)]) == [(0, 4)]
    assert length([(0, 2), (1, 3), (5, 6)]) == 4
    assert intersection([(0, 4), (6, 8)], [(3, 7)]) == [(3, 4), (6, 7)]
    assert subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert subtract([(0, 1)], [(0, 1)]) == []


# ---- every CUDA API the code calls exists in the pinned torch ------------------------------------------------

def sources() -> dict[str, str]:
    found = {str(p.relative_to(REPO)): p.read_text() for folder in ("coursekit", "bench", "autograder/exercises")
             for p in (REPO / folder).glob("*.py")}
    found |= {str(p.relative_to(REPO)): p.read_text() for p in (REPO / "solutions").rglob("*.py")}
    found |= {str(p.relative_to(REPO)): "\n".join(code_cells(p)) for p in SOLUTIONS}
    return found


def test_every_cuda_api_the_code_uses_exists_in_the_pinned_torch():
    pattern = re.compile(r"\btorch\.(?:cuda|backends\.cuda|backends\.cudnn|amp|version)(?:\.\w+)+")
    used = {(name, path) for path, text in sources().items() for name in pattern.findall(text)}
    assert len({name for name, _ in used}) > 10, "the scan found too few CUDA calls: is the pattern right?"
    missing = []
    for name, path in sorted(used):
        target = torch
        try:
            for part in name.split(".")[1:]:
                target = getattr(target, part)
        except AttributeError:
            missing.append(f"{name} ({path})")
    assert not missing, f"not in torch {torch.__version__}: {missing}"
    for attribute in ("is_user_annotation", "device_type", "time_range"):  # what coursekit.profiling reads
        assert hasattr(event("x", 0, 1), attribute)
    assert hasattr(DeviceType, "CUDA") and hasattr(torch.profiler.ProfilerActivity, "CUDA")
    import inspect

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    assert "device_ids" in inspect.signature(dist.barrier).parameters
    assert "device_ids" in inspect.signature(DistributedDataParallel).parameters
    assert "reshard_after_forward" in inspect.signature(fully_shard).parameters


# ---- devices: the local rank picks the GPU ---------------------------------------------------------------------

def test_a_rank_picks_its_gpu_by_local_rank(monkeypatch):
    """On the second machine of a job, global rank 9 is local rank 1: cuda:9 would not exist there."""
    import coursekit.dist as course_dist

    monkeypatch.setattr(course_dist.dist, "get_backend", lambda: "nccl")
    monkeypatch.setattr(course_dist.dist, "get_rank", lambda: 9)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert course_dist.my_device() == torch.device("cuda", 1)
    capstone = (REPO / "solutions" / "lesson6" / "capstone.py").read_text()
    assert "device = my_device()" in capstone and "rank_device(" not in capstone


# ---- the grader's CUDA scenarios ---------------------------------------------------------------------------------

def test_a_cuda_scenario_the_reference_could_not_run_costs_nothing():
    """The grader's worker saw a GPU but CUDA failed to start there (bubblewrap hides the device nodes, the 4 GiB
    address-space limit stops cuInit): the reference's and the student's CUDA scenarios both hold that error. A
    correct submission must still get full marks."""
    import copy

    from autograder.authoring.course import reference_function
    from autograder.exercises import get_exercise
    from autograder.exercises.beside.observing import observe

    exercise = get_exercise("train_amp")
    reference = observe(exercise, reference_function("train_amp"), as_reference=True)
    student = copy.deepcopy(reference)  # the reference solution, submitted by a student
    for observation in (reference, student):
        for key, scenario in list(observation["scenarios"].items()):
            case = {**scenario["case"], "device": "cuda", "what": scenario["case"]["what"] + " on cuda"}
            observation["scenarios"][f"{key}@cuda"] = {"case": case, "error": "RuntimeError: CUDA error: out of memory"}
    results = exercise.grade(student, reference)
    assert sum(r.score for r in results) == exercise.max_score, [r.feedback for r in results if not r.passed]
