"""No measurement typed into prose: every numeric claim in a markdown cell of solutions/ is on a reviewed list.

A number a student reads is either printed by a cell on their machine, or a *recorded* result shown with its
provenance (coursekit.recorded, coursekit.run_times). This test finds what looks like a measurement in markdown —
a number with a unit of time, memory, bandwidth or rate, a percentage or a ratio ("3×", "5 times"), a power of ten,
or a vague quantity ("a fraction of a percent", "several times") — and fails unless an entry of ``ALLOWED`` below
accepts it. Entries are reviewed like code; each says which kind of number it lets through and why:

* config     — a value the code sets and the text names (a bucket cap, a tensor size, a loop count);
* arithmetic — derived in the text itself from a formula or sizes shown there;
* definition — a format constant, a power of two, the course's own rules (study time, the run-time budget);
* citation   — a published figure, with its source named next to it.

A new measurement belongs in a cell's output, not in a new entry here.
"""
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(p for p in (REPO / "solutions").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)

_NUMBER = r"(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_UNIT = (r"(?:ns|µs|us|ms|s|sec|seconds?|minutes?|mins?|hours?|h|KB|KiB|MB|MiB|GB|GiB|TB|TiB|bytes?|"
         r"[GTPE]?FLOP/s|[GT]B/s|Gbit/s|%|×|x|times|percent|percentage points?|steps/s|samples/s|tokens/s)")
CLAIMS = [
    re.compile(rf"(?<![\w.^{{_]){_NUMBER}\s*(?:\\,|~)?\$?\s*\\?{_UNIT}(?![\w/])"),  # 45 s, 2.25 MiB, 10 %, 3×
    re.compile(r"10\^\{?[-−]?\d+\}?|10[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+"),  # 10^{-8}, 10⁻⁸
    re.compile(r"\\times\s*10"),  # 7.5 \times 10^9
    re.compile(r"fraction of a percent|several times|orders? of magnitude|percentage points?|a few percent"
               r"|\b(?:twice|half) as (?:fast|slow)|\b\w+-fold\b"
               # "under a minute", "in two hours"
               r"|\b(?:under|within|about|in|than) (?:a|an|one|two|three|half an?) (?:seconds?|minutes?|hours?)\b", re.I),
]

# (notebook stem or "*", regex that must match the claim with its context, kind, why it is not a typed-in measurement)
ALLOWED = [
    ("*", r"about \d+ min(?:utes)?\b", "definition", "study time: a reading guide, not a measurement"),
    ("*", r"about \d+(?:\.5)? h\b", "definition", "study time in hours: a planning guide, not a measurement"),
    ("00-start-here", r"budget is under 90 s", "definition", "the course's run-time rule"),
    # Lesson 2: the formats and the seed's claim under test
    ("02_mixed_precision", r'"2–3×', "citation", "the seed lesson's claim, quoted in order to be tested"),
    ("02_mixed_precision", r"10\^\{-8\}|3\\cdot 10\^\{-6\}", "config", "the example values the next cell stores"),
    ("02_mixed_precision", r"4,000 times", "config", "the loop count of the running-sum cell"),
    ("02_mixed_precision", r"\\approx [79]\.8\\cdot10\^\{-[34]\}", "definition", "2^-10 and 2^-7 written in decimal"),
    ("02_mixed_precision", r"A100 datasheet lists 19\.5 TFLOP/s|312 TFLOP/s for float16|156 TFLOP/s dense on the A100",
     "citation", "NVIDIA A100 datasheet, named in the sentence"),
    # Lesson 3: sizes the cells use
    ("03_data_parallel", r"from 4 bytes to 16 MiB", "config", "the message sizes of the timing sweep"),
    ("03_data_parallel", r"all-reduce of 4 MiB per rank", "config", "the traffic-counting cell's message size"),
    ("03_data_parallel", r"25 MiB|at most 1 MiB|capped at 1 MiB|reaches\s1 MiB|0\.25 MiB buckets", "config",
     "DDP's bucket_cap_mb default and first-bucket cap (torch's documented defaults) and the buckets the cell sets"),
    ("03_data_parallel", r"7-layer MLP \(1\.5 MiB of gradients\)|1\.15 MiB to all-reduce", "arithmetic",
     "parameter count × 4 bytes of the model the cell builds"),
    ("03_data_parallel", r"6 layers of 512 × 512", "config", "the grader's overlap scenario, stated in the exercise"),
    ("05_fsdp_zero", r"8 layers of 768 × 768|about\s2\.25 MiB each", "config",
     "the grader's memory scenario, stated in the exercise (768² float32 values = 2.25 MiB)"),
    ("09_failures", r"at most 8 MiB to one file", "config", "the class grader's sandbox limit per file (docs/authoring.md)"),
    ("09_failures", r"\(300 s by default|timeout of 0\.5 s|let go 0\.15 s|a little \(10 ms\)", "config",
     "torch's TCPStore default timeout, the next cell's store timeout, FlightRecorder's late rank and a hint's poll"),
    ("07_transformers", r"float32 matrix is 16 MiB", "arithmetic", "2048² float32 values, the grader's memory scenario"),
    ("07_transformers", r"tolerance of \$10\^\{-5\}\$", "config", "the tolerance the next cell applies"),
    ("07_transformers", r"1 × 128|128 × 128", "citation", "DeepSeek-V3's FP8 tile and block sizes"),
    ("07_transformers", r"as/16h = 2", "arithmetic", "4 heads × 512 / (16 × 64), the sizes the same sentence gives"),
    # Lesson 4: the bubble formula's example, the measurement protocol, sizes
    ("04_model_pipeline_parallel", r"at most 10 %|= 10 %", "arithmetic", "(p−1)/(m+p−1) for the example shown"),
    ("04_model_pipeline_parallel", r"runs 5 times", "config", "the repetition count of the timing cell"),
    ("04_model_pipeline_parallel", r"±50 %", "config", "the tolerance the checking cell states and uses"),
    ("04_model_pipeline_parallel", r"768\$ bytes|768\^2 \\cdot 4\$ bytes = 2\.25 MiB", "arithmetic",
     "activation and weight-gradient bytes from the widths the cell sets"),
    # Lesson 5: the ZeRO paper's example and sizes the cells use
    ("05_fsdp_zero", r"120 GB|31\.4 GB|16\.6 GB|1\.88 GB|1\.40625\$ GB|7\.5 \\times 10\^9|10\^9|16 bytes",
     "citation", "the ZeRO paper's worked example (Rajbhandari et al., 2020), recomputed by the exercise"),
    ("05_fsdp_zero", r"31,406,250,000\.0 bytes", "arithmetic", "zero_memory_per_rank(7.5e9, 64, 1), worked"),
    ("05_fsdp_zero", r"1\.5×|\$?[23] ?\\times", "arithmetic", "communication volumes in units of Ψ, derived above"),
    ("05_fsdp_zero", r"1\.33×", "arithmetic", "checkpointing's extra forward: 4/3 of the step's passes"),
    ("05_fsdp_zero", r"128 \\times 512\$ floats, 2\.25 MiB|\$a\$ = 128 KiB", "arithmetic",
     "activation bytes of the shapes the cell sets"),
    ("05_fsdp_zero", r"reserve 25 %", "config", "the activation reserve the planning cell uses"),
    ("05_fsdp_zero", r"less than 1 GB per rank", "config", "the threshold a prediction asks about; the cell computes it"),
    # Lesson 6: the configurations the profiling cells run
    ("06_profiling_capstone", r"\b(?:1|4|9|25) MB\b|gradient is 4 MiB", "config",
     "bucket_cap_mb values the sweep sets, and one hidden layer's gradient (1024² × 4 bytes)"),
    ("06_profiling_capstone", r"MFU = 40 %", "config", "the MFU the next cell sets (MFU = 0.4)"),
    # Lesson 10: the add's bytes and the tiles the kernels launch with
    ("10_triton_kernels", r"operation per 12 bytes", "arithmetic",
     "the add reads two float32 and writes one (3 × 4 bytes), as the cell above counted per program"),
    ("10_triton_kernels", r"32 × 32 tiles", "config", "the tile sizes the next cells launch the kernel with"),
]

# Lessons whose remaining claims another engineer is still fixing: reported, not failed. Keep this empty.
KNOWN_PENDING: set[str] = set()


def claims(path: Path) -> list[tuple[int, str, str, int]]:
    """(cell index, claim, text around it, where the claim starts in that text) for every numeric claim in the
    notebook's markdown."""
    found = []
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        for pattern in CLAIMS:
            for match in pattern.finditer(text):
                start = max(0, match.start() - 60)
                found.append((index, match.group(0), text[start:match.end() + 30], match.start() - start))
    return found


def allowed(stem: str, claim: str, around: str, at: int) -> bool:
    """An entry for this notebook whose rule matches text that overlaps the claim itself, not just a neighbour."""
    return any(where in ("*", stem) and any(m.start() < at + len(claim) and at < m.end()
                                            for m in re.finditer(rule, around))
               for where, rule, _, _ in ALLOWED)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_no_typed_in_measurements(path):
    unexplained = [f"  cell {i}: {claim!r} in …{around!r}…" for i, claim, around, at in claims(path)
                   if not allowed(path.stem, claim, around, at)]
    if unexplained and path.stem in KNOWN_PENDING:
        pytest.xfail(f"{path.stem}: known pending, {len(unexplained)} claims")
    assert not unexplained, (
        f"{path.relative_to(REPO)}: numbers in prose that no cell prints and no reviewed entry allows. Print them from a "
        f"cell, show them as recorded (coursekit.recorded), or — only for config/arithmetic/definition/citation — add an "
        f"entry to ALLOWED:\n" + "\n".join(unexplained))


def test_the_checker_catches_typed_in_measurements(tmp_path):
    """A plausible typed-in measurement of each kind is flagged; the reviewed kinds are not."""
    flagged = ["The epoch took 45 s here.", "Peak memory was 6.01 MiB.", "about 3× faster", "within 2 %",
               "differences around $10^{-8}$", "agrees to a fraction of a percent", "several times slower",
               "within one or two percentage points", "bf16 ran 1.8 times slower", "around 10⁻⁸",
               "about 20 minutes to run, and 12 s on this CPU",
               "the notebook itself runs in under a minute"]
    clean = ["A batch of 1,024 sequences", "float16 has 10 mantissa bits", "$2^{-24}$", "rank 0 of 2 ranks",
             "study time about 20 minutes"]
    cells = [{"cell_type": "markdown", "source": [text]} for text in flagged + clean]
    notebook = tmp_path / "x.ipynb"
    notebook.write_text(json.dumps({"cells": cells}))
    hits = {i for i, claim, around, at in claims(notebook) if not allowed("x", claim, around, at)}
    assert hits == set(range(len(flagged)))
