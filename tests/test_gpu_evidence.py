"""The GPU evidence recorder works end to end without a GPU: its CPU dry run writes every section, and on a
machine without CUDA the real command refuses clearly. Also the interval arithmetic the profiling breakdown
(Lesson 6, and the recorder's lesson6_comm_share) rests on.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.gpu_evidence import RESULTS, SECTIONS
from coursekit.profiling import intersection, length, subtract, union

REPO = Path(__file__).resolve().parent.parent


def run(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "bench.gpu_evidence", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.glob("*")} if folder.exists() else {}


@pytest.mark.slow
def test_dry_run_records_every_section_and_leaves_the_committed_results_alone(tmp_path):
    committed = snapshot(RESULTS)
    done = run("--dry-run", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert snapshot(RESULTS) == committed, "a dry run must never touch bench/results"

    results = json.loads((tmp_path / "gpu_evidence.json").read_text())
    assert results["provenance"]["dry_run"] is True
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
        assert row["busbw GB/s"] == pytest.approx(row["algbw GB/s"] * 2 * (n - 1) / n)
        assert row["algbw GB/s"] == pytest.approx(row["bytes"] / (row["time us"] * 1e-6) / 1e9)
    for row in results["lesson6_comm_share"]["rows"]:
        parts = sum(row[f"{k} %"] for k in ("compute only", "overlapped", "exposed comm", "idle"))
        assert parts == pytest.approx(100, abs=1e-6)
    fsdp = {(r["setup"], r["ranks"]): r for r in results["lesson5_fsdp_zero"]["rows"]}
    assert fsdp["FSDP2", 2]["state MiB (measured)"] == pytest.approx(fsdp["DDP", 2]["state MiB (measured)"] / 2)


@pytest.mark.slow
def test_dry_run_with_one_rank_takes_the_single_gpu_paths(tmp_path):
    done = run("--dry-run", "--ranks", "1", "--out", str(tmp_path),
               "--only", "lesson3_allreduce", "lesson3_data_parallel", "lesson4_pipeline_parallel")
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "gpu_evidence.json").read_text())
    assert set(results) == {"provenance", "lesson3_allreduce", "lesson3_data_parallel", "lesson4_pipeline_parallel"}
    for name in ("lesson3_allreduce", "lesson3_data_parallel", "lesson4_pipeline_parallel"):
        assert results[name]["notes"].startswith("Only one GPU was visible"), name
    assert all(r["busbw GB/s"] == 0 for r in results["lesson3_allreduce"]["rows"])
    assert "2-stage step ms (model)" in results["lesson4_pipeline_parallel"]["rows"][0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_real_command_refuses_and_writes_nothing(tmp_path):
    done = run("--out", str(tmp_path), timeout=120)
    assert done.returncode != 0
    assert "No CUDA GPU is visible" in done.stderr and "--dry-run" in done.stderr
    assert not any(tmp_path.iterdir())


def test_interval_arithmetic():
    assert union([(3, 4), (0, 2), (1, 3)]) == [(0, 4)]
    assert length([(0, 2), (1, 3), (5, 6)]) == 4
    assert intersection([(0, 4), (6, 8)], [(3, 7)]) == [(3, 4), (6, 7)]
    assert subtract([(0, 10)], [(2, 3), (5, 7)]) == [(0, 2), (3, 5), (7, 10)]
    assert subtract([(0, 1)], [(0, 1)]) == []
