"""The fast tier again under the CPU kernels other machines pick (``make test-any-cpu``; ``make test`` ends with it).

ATen chooses its CPU kernels at run time (AVX-512, AVX2 or the portable default), oneDNN its own (up to AMX), and
float results differ in the last bits between them. A class and a CI runner may have any of these CPUs, so every
equality a lesson states or a test asserts must hold under each. This runs the fast tier under the two capability
levels this CPU can run besides its own (``ATEN_CPU_CAPABILITY``, with ``ONEDNN_MAX_CPU_ISA`` capped to match),
side by side, and fails if either run fails. Files that judge no float (``NO_FLOATS``) run once, in the first
tier; tests marked ``serial`` stay out too: they need the machine to themselves and judge no float.

What a kernel level can change is the last bits of a float, so what it can break is a comparison a right answer
passes by little: a correct variant against the reference's tolerance. So under each level every correct variant is
graded and diagnosed as in the first tier, with the reference observed under that level. A wrong variant's mistake
moves its results by far more than the last bits, and the relations the localisation names it by (a factor, a sign,
where) have margins as wide: each is graded and diagnosed under one of the two levels (ANY_CPU_SHARE=k/n: the
``one_level`` tests whose index is k modulo n, conftest.py), and so is each of test_localisation.py's cells
(uncatalogued mistakes). That still puts every catalogued mistake's diagnosis, every localisation pattern and every
check's failure through another kernel than the first tier's, at about half the cost (the variants are most of the
tier's time). Natively, the first tier grades every variant, as before. ``NATIVE_ONLY`` files run in the first tier
only: they re-derive a generated file that the first tier checks (known_fails.py, from every variant under every
salt, as ``generate --check`` does for the references); what the record is for, each named variant's diagnosis, is
judged here.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# ATen's level → the oneDNN ISA a machine of that level has at most
LEVELS = {"default": "SSE41", "avx2": "AVX2", "avx512": "AVX512_CORE"}
TIER = "not slow and not browser and not serial"
# Fast-tier files that judge no float a kernel computes (packaging, parsing, the sandbox, the layout of reports and
# of the repository, the lessons' text, recorded times, the scheduling of these tests, the launcher's gate policies,
# Triton's interpreter as Lesson 10 drives it: bytes counted, and one sum of small integers, exact at every level):
# the same outcome under every kernel level, so they run once, in the first tier.
NO_FLOATS = ("test_accessibility", "test_cell_length", "test_cgroups", "test_class_report", "test_course",
             "test_exercise_scaffolds", "test_feedback_files", "test_fingerprint", "test_gate_policies",
             "test_gradebook_record", "test_hostile_parsing", "test_hub_welcome", "test_kernels", "test_kit_assignment_list",
             "test_layering", "test_make_lab", "test_markdown_feedback", "test_needed_libraries", "test_packaging",
             "test_predictions_fair", "test_prose_numbers", "test_readme_commands", "test_run_times",
             "test_sandbox_defences", "test_sandbox_etc", "test_sandbox_gpu", "test_sandbox_hugepages",
             "test_student_kit", "test_study_time", "test_xdist_units")
# Fast-tier files that check a generated record against a fresh run of the variants (see the docstring).
NATIVE_ONLY = ("test_known_fails",)


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def levels_here(flags: set[str]) -> list[str]:
    """The levels this CPU can run, the best (its own, unless capped by the environment) last."""
    have = ["default"] + ["avx2"] * ("avx2" in flags) + ["avx512"] * ({"avx512f", "avx512bw", "avx512vl"} <= flags)
    own = os.environ.get("ATEN_CPU_CAPABILITY", have[-1])
    return [level for level in have if level != own][-2:]


def main() -> int:
    others = levels_here(cpu_flags())
    if not others:
        print("any-cpu: this CPU runs only ATen's default kernels: nothing else to try")
        return 0
    runs, logs = {}, {}
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    started = time.monotonic()
    for share, level in enumerate(others):
        # torch.compile's kernel cache is shared per user and keyed without the level: a kernel built for AVX-512
        # does not compile for the default level, so each level gets a cache of its own
        cache = REPO / "test-artifacts" / f"inductor-cache-{level}"
        env = {**os.environ, "ATEN_CPU_CAPABILITY": level, "ONEDNN_MAX_CPU_ISA": LEVELS[level],
               "TORCHINDUCTOR_CACHE_DIR": str(cache), "ANY_CPU_SHARE": f"{share}/{len(others)}"}
        logs[level] = (REPO / "test-artifacts" / f"any-cpu-{level}.log").open("w")
        skipped = [f"--ignore={path.relative_to(REPO)}"
                   for name in NO_FLOATS + NATIVE_ONLY for path in REPO.glob(f"tests/**/{name}.py")]
        runs[level] = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", TIER,
                                        "-o", "addopts=-rf", *skipped],
                                       cwd=REPO, env=env, stdout=logs[level], stderr=subprocess.STDOUT)
    failed = []
    for level, run in runs.items():
        code = run.wait()
        logs[level].close()
        lines = Path(logs[level].name).read_text().splitlines()
        summary = [line for line in lines if line.startswith(("FAILED", "ERROR"))] + lines[-1:]
        print(f"any-cpu: ATEN_CPU_CAPABILITY={level} ONEDNN_MAX_CPU_ISA={LEVELS[level]}:", *summary, sep="\n  ")
        if code:
            failed.append(level)
    print(f"any-cpu: {len(runs)} runs side by side in {time.monotonic() - started:.0f} s"
          + (f"; failed under {', '.join(failed)} (logs: test-artifacts/any-cpu-*.log)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
